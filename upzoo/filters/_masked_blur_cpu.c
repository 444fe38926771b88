/* Fused CPU kernel of the masked Gaussian blur (hard threshold), forward and backward.
 *
 * The PyTorch formulation in masked_blur.py needs about 20 passes over memory and a dozen calls;
 * here one pass per plane does the whole forward and two do the backward, while the plane is in
 * cache. Everything is 3D (a 2D input is D = 1 with a one-tap depth kernel). Planes (batch x
 * channel) are split between threads. The Python side checks every argument; this file trusts them.
 *
 * Geometry, per axis (z, y, x): the lattice of blurred positions is first + i * step for
 * i < count (input coordinates); the window of position i starts at window + i * step in the
 * source `xp` (the padded input, or the input itself for border="valid").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TAPS 64  /* per axis; masked_blur.py sends larger kernels to the PyTorch formulation */

typedef struct {
    int64_t planes;
    int64_t size[3];         /* D, H, W of the input */
    int64_t psize[3];        /* D, H, W of the source (padded) */
    int64_t first[3], count[3], step[3], window[3];
    int64_t taps_len[3];
    double taps[3][MAX_TAPS];
    double threshold;
    int aliased;             /* source == input (border="valid"): backward accumulates in place */
} Geometry;

typedef struct {
    const Geometry *g;
    int is_double;
    int backward;
    const void *x, *src, *grad;  /* forward: x, xp ; backward: x, grad_out */
    void *out, *acc;             /* forward: out ; backward: grad_x, grad of the source */
} Job;

/* With GCC or Clang on x86-64, each kernel is also compiled for AVX2 + FMA and the loader picks
 * the version this CPU runs (the default one is plain x86-64). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && defined(__linux__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* One implementation per dtype. */
#define T float
#define KERNEL(name) name##_f32
#include "_masked_blur_cpu_impl.h"
#undef T
#undef KERNEL
#define T double
#define KERNEL(name) name##_f64
#include "_masked_blur_cpu_impl.h"
#undef T
#undef KERNEL

static int run_planes(const Job *job, int64_t begin, int64_t end) {
    const Geometry *g = job->g;
    if (!job->backward)
        return job->is_double ? forward_f64(g, job->x, job->src, job->out, begin, end)
                              : forward_f32(g, job->x, job->src, job->out, begin, end);
    return job->is_double ? backward_f64(g, job->x, job->grad, job->out, job->acc, begin, end)
                          : backward_f32(g, job->x, job->grad, job->out, job->acc, begin, end);
}

/* Split the planes between up to `threads` OpenMP threads. The extension links libgomp by its
 * soname, which resolves to the copy PyTorch already loaded, so these are PyTorch's own intra-op
 * threads (a second pool would fight them for the cores). Small work stays on one thread. */
static int run_parallel(const Job *job, int threads) {
    const Geometry *g = job->g;
    const int64_t per_thread = 1 << 16;  /* elements below which another thread costs more than it saves */
    int64_t n = g->planes * g->size[0] * g->size[1] * g->size[2] / per_thread;
    if (n > threads) n = threads;
    if (n > g->planes) n = g->planes;
    if (n < 1) n = 1;
    int failed = 0;
    #pragma omp parallel for num_threads((int)n) schedule(static) reduction(|: failed) if (n > 1)
    for (int64_t i = 0; i < n; i++)
        failed |= run_planes(job, g->planes * i / n, g->planes * (i + 1) / n) != 0;
    return failed ? -1 : 0;
}

/* Geometry from a tuple: (planes, size[3], psize[3], first[3], count[3], step[3], window[3],
 * taps_z, taps_y, taps_x, threshold, aliased) with the taps as tuples of floats. */
static int parse_geometry(PyObject *spec, Geometry *g) {
    memset(g, 0, sizeof(*g));
    int64_t *fields[] = {g->size, g->psize, g->first, g->count, g->step, g->window};
    PyObject *taps[3];
    PyObject *ints[6];
    long long planes;
    if (!PyArg_ParseTuple(spec, "LOOOOOOOOOdp", &planes, &ints[0], &ints[1], &ints[2], &ints[3], &ints[4],
                          &ints[5], &taps[0], &taps[1], &taps[2], &g->threshold, &g->aliased))
        return -1;
    g->planes = planes;
    for (int f = 0; f < 6; f++) {
        long long a, b, c;
        if (!PyArg_ParseTuple(ints[f], "LLL", &a, &b, &c)) return -1;
        fields[f][0] = a; fields[f][1] = b; fields[f][2] = c;
    }
    for (int axis = 0; axis < 3; axis++) {
        PyObject *seq = PySequence_Fast(taps[axis], "taps must be a sequence");
        if (!seq) return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n < 1 || n > MAX_TAPS) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "1 to %d taps per axis, got %zd", MAX_TAPS, n);
            return -1;
        }
        g->taps_len[axis] = n;
        for (Py_ssize_t i = 0; i < n; i++) g->taps[axis][i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
        if (PyErr_Occurred()) return -1;
    }
    return 0;
}

static PyObject *call(PyObject *args, int backward) {
    PyObject *spec;
    unsigned long long x, a, b, c = 0;
    int is_double, threads;
    int ok = backward ? PyArg_ParseTuple(args, "OKKKKpi", &spec, &x, &a, &b, &c, &is_double, &threads)
                      : PyArg_ParseTuple(args, "OKKKpi", &spec, &x, &a, &b, &is_double, &threads);
    if (!ok) return NULL;
    Geometry g;
    if (parse_geometry(spec, &g) < 0) return NULL;
    Job job = {0};
    job.g = &g;
    job.is_double = is_double;
    job.backward = backward;
    job.x = (const void *)(uintptr_t)x;
    if (backward) {  /* grad_out, grad_x, grad of the source */
        job.grad = (const void *)(uintptr_t)a;
        job.out = (void *)(uintptr_t)b;
        job.acc = (void *)(uintptr_t)c;
    } else {         /* source, out */
        job.src = (const void *)(uintptr_t)a;
        job.out = (void *)(uintptr_t)b;
    }
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = run_parallel(&job, threads);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *forward(PyObject *self, PyObject *args) { return call(args, 0); }
static PyObject *backward(PyObject *self, PyObject *args) { return call(args, 1); }

static PyMethodDef methods[] = {
    {"forward", forward, METH_VARARGS,
     "forward(geometry, x_ptr, source_ptr, out_ptr, is_double, threads): write the filtered x into out"},
    {"backward", backward, METH_VARARGS,
     "backward(geometry, x_ptr, grad_ptr, grad_x_ptr, grad_source_ptr, is_double, threads): the gradients"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_masked_blur_cpu", "Fused CPU kernel of upzoo's masked Gaussian blur.", -1, methods,
};

PyMODINIT_FUNC PyInit__masked_blur_cpu(void) { return PyModule_Create(&module); }
