/* The kernels for one dtype: included once per dtype by _masked_blur_cpu.c with T (the element
 * type) and KERNEL(name) (the dtype-suffixed function name) defined.
 *
 * Each plane is processed one lattice row at a time: the rows of the window are first combined
 * across depth and height (`v`, one value per source column), then along the row. The common case
 * (three rows, three column taps, stride 1) has loops of its own that the compiler vectorises into
 * a single pass; every other geometry takes the general loops. Every comparison is a select on
 * values already loaded, never a branch (random data would mispredict it). */

/* v = sum_i t[i] * rows[i], over n columns. */
static inline void KERNEL(combine_rows)(T *restrict v, const T *const *rows, const T *t, int64_t count, int64_t n) {
    if (count == 3) {
        const T *restrict r0 = rows[0], *restrict r1 = rows[1], *restrict r2 = rows[2];
        const T t0 = t[0], t1 = t[1], t2 = t[2];
        for (int64_t i = 0; i < n; i++) v[i] = t0 * r0[i] + t1 * r1[i] + t2 * r2[i];
        return;
    }
    const T *restrict r0 = rows[0];
    for (int64_t i = 0; i < n; i++) v[i] = t[0] * r0[i];
    for (int64_t k = 1; k < count; k++) {
        const T *restrict r = rows[k];
        const T tk = t[k];
        for (int64_t i = 0; i < n; i++) v[i] += tk * r[i];
    }
}

/* dst[i] += t[i] * u, for each of the rows. */
static inline void KERNEL(spread_rows)(T *const *rows, const T *t, int64_t count, const T *restrict u, int64_t n) {
    if (count == 3) {
        T *restrict r0 = rows[0], *restrict r1 = rows[1], *restrict r2 = rows[2];
        const T t0 = t[0], t1 = t[1], t2 = t[2];
        for (int64_t i = 0; i < n; i++) {
            const T value = u[i];
            r0[i] += t0 * value;
            r1[i] += t1 * value;
            r2[i] += t2 * value;
        }
        return;
    }
    for (int64_t k = 0; k < count; k++) {
        T *restrict r = rows[k];
        const T tk = t[k];
        for (int64_t i = 0; i < n; i++) r[i] += tk * u[i];
    }
}

/* out[j * step] = blur of v at lattice column j where x[j * step] >= threshold, else x. */
static inline void KERNEL(blur_and_blend_row)(T *restrict out, const T *restrict x, const T *restrict v, T *restrict h,
                                              const T *tx, int64_t kx, int64_t n, int64_t step, T threshold) {
    if (step == 1 && kx == 3) {
        const T t0 = tx[0], t1 = tx[1], t2 = tx[2];
        for (int64_t j = 0; j < n; j++) {
            /* stored unconditionally, the blur is not sunk into a branch: the loop stays branch-free */
            const T kept = x[j], blurred = h[j] = t0 * v[j] + t1 * v[j + 1] + t2 * v[j + 2];
            out[j] = kept >= threshold ? blurred : kept;
        }
        return;
    }
    for (int64_t j = 0; j < n; j++) h[j] = tx[0] * v[j * step];
    for (int64_t c = 1; c < kx; c++)
        for (int64_t j = 0; j < n; j++) h[j] += tx[c] * v[j * step + c];
    for (int64_t j = 0; j < n; j++) {
        const T kept = x[j * step], blurred = h[j];
        out[j * step] = kept >= threshold ? blurred : kept;
    }
}

/* Where x[j * step] >= threshold the direct gradient stops: grad_x = 0 there. */
static inline void KERNEL(stop_row)(T *restrict grad_x, const T *restrict x, int64_t n, int64_t step, T threshold) {
    if (step == 1) {  /* the same loop, with a step the compiler knows */
        for (int64_t j = 0; j < n; j++) {
            const T value = x[j], kept = grad_x[j];
            grad_x[j] = value >= threshold ? (T)0 : kept;
        }
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        const T value = x[j * step], kept = grad_x[j * step];
        grad_x[j * step] = value >= threshold ? (T)0 : kept;
    }
}

/* picked[j] = the output gradient where x[j * step] >= threshold, else 0; returns whether any. */
static inline int KERNEL(pick_row)(T *restrict picked, const T *restrict grad, const T *restrict x, int64_t n,
                                   int64_t step, T threshold) {
    int64_t blurred = 0;
    if (step == 1) {  /* the same loop, with a step the compiler knows */
        for (int64_t j = 0; j < n; j++) {
            const T value = x[j], g = grad[j];
            picked[j] = value >= threshold ? g : (T)0;
            blurred += value >= threshold;
        }
        return blurred != 0;
    }
    for (int64_t j = 0; j < n; j++) {
        const T value = x[j * step], g = grad[j * step];
        picked[j] = value >= threshold ? g : (T)0;
        blurred += value >= threshold;
    }
    return blurred != 0;
}

/* u[col] = sum_c tx[c] * picked[j] over col = j * step + c: the adjoint of the blur along the row.
 * `picked` has kx - 1 zeros before and after it (so the step-1 gather needs no bounds). */
static inline void KERNEL(unblur_row)(T *restrict u, const T *restrict picked, const T *tx, int64_t kx, int64_t n,
                                      int64_t step, int64_t span) {
    if (step == 1) {
        const T *restrict p = picked + (kx - 1);
        if (kx == 3) {
            const T t0 = tx[0], t1 = tx[1], t2 = tx[2];
            for (int64_t col = 0; col < span; col++) u[col] = t0 * p[col] + t1 * p[col - 1] + t2 * p[col - 2];
            return;
        }
        for (int64_t col = 0; col < span; col++) u[col] = tx[0] * p[col];
        for (int64_t c = 1; c < kx; c++)
            for (int64_t col = 0; col < span; col++) u[col] += tx[c] * p[col - c];
        return;
    }
    const T *restrict p = picked + (kx - 1);
    for (int64_t col = 0; col < span; col++) u[col] = 0;
    for (int64_t c = 0; c < kx; c++)
        for (int64_t j = 0; j < n; j++) u[j * step + c] += tx[c] * p[j];
}

CLONES static int KERNEL(forward)(const Geometry *g, const T *x, const T *xp, T *out, int64_t begin, int64_t end) {
    const int64_t H = g->size[1], W = g->size[2], plane = g->size[0] * H * W;
    const int64_t PH = g->psize[1], PW = g->psize[2], pplane = g->psize[0] * PH * PW;
    const int64_t kz = g->taps_len[0], ky = g->taps_len[1], kx = g->taps_len[2], rows = kz * ky;
    const int64_t cx = g->count[2], sx = g->step[2], wx = g->window[2], fx = g->first[2];
    const int64_t span = (cx - 1) * sx + kx; /* source columns a lattice row reads */
    T tx[MAX_TAPS], tzy[MAX_TAPS * MAX_TAPS];
    const T *row_ptrs[MAX_TAPS * MAX_TAPS];
    for (int64_t c = 0; c < kx; c++) tx[c] = (T)g->taps[2][c];
    for (int64_t a = 0; a < kz; a++)
        for (int64_t b = 0; b < ky; b++) tzy[a * ky + b] = (T)(g->taps[0][a] * g->taps[1][b]);
    const T threshold = (T)g->threshold;
    T *v = malloc(sizeof(T) * (size_t)(span + cx));
    if (!v) return -1;
    T *h = v + span;
    for (int64_t p = begin; p < end; p++) {
        const T *X = x + p * plane, *XP = xp + p * pplane;
        T *O = out + p * plane;
        memcpy(O, X, sizeof(T) * (size_t)plane);  /* off the lattice the output is the input */
        for (int64_t iz = 0; iz < g->count[0]; iz++)
            for (int64_t iy = 0; iy < g->count[1]; iy++) {
                const int64_t z0 = g->window[0] + iz * g->step[0], y0 = g->window[1] + iy * g->step[1];
                for (int64_t a = 0; a < kz; a++)
                    for (int64_t b = 0; b < ky; b++) row_ptrs[a * ky + b] = XP + ((z0 + a) * PH + (y0 + b)) * PW + wx;
                KERNEL(combine_rows)(v, row_ptrs, tzy, rows, span);
                const int64_t at = ((g->first[0] + iz * g->step[0]) * H + g->first[1] + iy * g->step[1]) * W + fx;
                KERNEL(blur_and_blend_row)(O + at, X + at, v, h, tx, kx, cx, sx, threshold);
            }
    }
    free(v);
    return 0;
}

CLONES static int KERNEL(backward)(const Geometry *g, const T *x, const T *grad, T *gx, T *gsrc, int64_t begin,
                                   int64_t end) {
    const int64_t H = g->size[1], W = g->size[2], plane = g->size[0] * H * W;
    const int64_t PH = g->psize[1], PW = g->psize[2], pplane = g->psize[0] * PH * PW;
    const int64_t kz = g->taps_len[0], ky = g->taps_len[1], kx = g->taps_len[2], rows = kz * ky;
    const int64_t cx = g->count[2], sx = g->step[2], wx = g->window[2], fx = g->first[2];
    const int64_t span = (cx - 1) * sx + kx;
    T tx[MAX_TAPS], tzy[MAX_TAPS * MAX_TAPS];
    T *row_ptrs[MAX_TAPS * MAX_TAPS];
    for (int64_t c = 0; c < kx; c++) tx[c] = (T)g->taps[2][c];
    for (int64_t a = 0; a < kz; a++)
        for (int64_t b = 0; b < ky; b++) tzy[a * ky + b] = (T)(g->taps[0][a] * g->taps[1][b]);
    const T threshold = (T)g->threshold;
    T *u = malloc(sizeof(T) * (size_t)(span + cx + 2 * (kx - 1)));
    if (!u) return -1;
    T *picked = u + span;  /* cx values with kx - 1 zeros on either side */
    for (int64_t i = 0; i < cx + 2 * (kx - 1); i++) picked[i] = 0;
    for (int64_t p = begin; p < end; p++) {
        const T *X = x + p * plane, *G = grad + p * plane;
        T *GX = gx + p * plane, *GS = gsrc + p * pplane;
        /* direct path: the output gradient passes where the pixel was kept; pick_row stops it where
           the pixel was blurred. All of it before any window is added: with border="valid" the
           windows land in grad_x itself. */
        memcpy(GX, G, sizeof(T) * (size_t)plane);
        if (!g->aliased) memset(GS, 0, sizeof(T) * (size_t)pplane);
        for (int64_t iz = 0; iz < g->count[0]; iz++)
            for (int64_t iy = 0; iy < g->count[1]; iy++) {
                const int64_t at = ((g->first[0] + iz * g->step[0]) * H + g->first[1] + iy * g->step[1]) * W + fx;
                KERNEL(stop_row)(GX + at, X + at, cx, sx, threshold);
            }
        /* blur path: each blurred pixel's gradient spread over its window */
        for (int64_t iz = 0; iz < g->count[0]; iz++)
            for (int64_t iy = 0; iy < g->count[1]; iy++) {
                const int64_t at = ((g->first[0] + iz * g->step[0]) * H + g->first[1] + iy * g->step[1]) * W + fx;
                if (!KERNEL(pick_row)(picked + kx - 1, G + at, X + at, cx, sx, threshold)) continue;
                KERNEL(unblur_row)(u, picked, tx, kx, cx, sx, span);
                const int64_t z0 = g->window[0] + iz * g->step[0], y0 = g->window[1] + iy * g->step[1];
                for (int64_t a = 0; a < kz; a++)
                    for (int64_t b = 0; b < ky; b++) row_ptrs[a * ky + b] = GS + ((z0 + a) * PH + (y0 + b)) * PW + wx;
                KERNEL(spread_rows)(row_ptrs, tzy, rows, u, span);
            }
    }
    free(u);
    return 0;
}
