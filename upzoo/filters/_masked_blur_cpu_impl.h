/* The kernels for one dtype: included once per dtype by _masked_blur_cpu.c with T (the element
 * type) and KERNEL(name) (the dtype-suffixed function name) defined.
 *
 * Each plane is processed one lattice row at a time. The window's taps are applied one axis after
 * the other: in 3D the depth taps first combine whole source rows into a slice (once per depth
 * position of the lattice), the height taps then combine rows into one row (one value per source
 * column), and the row is blurred along its length at the lattice columns. The backward runs the
 * same steps in reverse as spreads. The common case (three rows, three column taps, stride 1) has
 * loops of its own that the compiler vectorises into a single pass; every other geometry takes the
 * general loops. Every comparison is a select on values already loaded, never a branch (random data
 * would mispredict it). */

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

/* Taps as T, and the buffers one thread needs. A 3D window is combined across depth first, into
 * `slice` (one row per source row the lattice reads), so the work per position is kz + ky + kx,
 * not kz * ky + kx; a 2D one reads the source rows directly. */
typedef struct {
    T tz[MAX_TAPS], ty[MAX_TAPS], tx[MAX_TAPS];
    int64_t span;       /* source columns a lattice row reads */
    int64_t rows;       /* source rows a depth position of the lattice reads */
    T *row;             /* span values: the window rows combined (forward) or spread (backward) */
    T *lattice;         /* count[2] values + 2 * (kx - 1) zeros around them (backward) */
    T *slice;           /* rows * span values when kz > 1 */
} KERNEL(Scratch);

static int KERNEL(scratch_init)(KERNEL(Scratch) *s, const Geometry *g) {
    const int64_t kz = g->taps_len[0], ky = g->taps_len[1], kx = g->taps_len[2], cx = g->count[2];
    for (int64_t i = 0; i < kz; i++) s->tz[i] = (T)g->taps[0][i];
    for (int64_t i = 0; i < ky; i++) s->ty[i] = (T)g->taps[1][i];
    for (int64_t i = 0; i < kx; i++) s->tx[i] = (T)g->taps[2][i];
    s->span = (cx - 1) * g->step[2] + kx;
    s->rows = (g->count[1] - 1) * g->step[1] + ky;
    const int64_t lattice = cx + 2 * (kx - 1), slice = kz > 1 ? s->rows * s->span : 0;
    s->row = calloc((size_t)(s->span + lattice + slice), sizeof(T));
    s->lattice = s->row + s->span;
    s->slice = kz > 1 ? s->lattice + lattice : NULL;
    return s->row ? 0 : -1;
}

CLONES static int KERNEL(forward)(const Geometry *g, const T *x, const T *xp, T *out, int64_t begin, int64_t end) {
    const int64_t H = g->size[1], W = g->size[2], plane = g->size[0] * H * W;
    const int64_t PH = g->psize[1], PW = g->psize[2], pplane = g->psize[0] * PH * PW;
    const int64_t kz = g->taps_len[0], ky = g->taps_len[1], kx = g->taps_len[2];
    const int64_t cx = g->count[2], sx = g->step[2], sy = g->step[1], wx = g->window[2], wy = g->window[1];
    const T threshold = (T)g->threshold;
    const T *sources[MAX_TAPS];
    KERNEL(Scratch) s;
    if (KERNEL(scratch_init)(&s, g) < 0) return -1;
    for (int64_t p = begin; p < end; p++) {
        const T *X = x + p * plane, *XP = xp + p * pplane;
        T *O = out + p * plane;
        memcpy(O, X, sizeof(T) * (size_t)plane);  /* off the lattice the output is the input */
        for (int64_t iz = 0; iz < g->count[0]; iz++) {
            const int64_t z0 = g->window[0] + iz * g->step[0];
            const T *slice = XP + (z0 * PH + wy) * PW + wx;
            int64_t pitch = PW;
            if (kz > 1) {  /* combine the depth taps once per source row */
                for (int64_t r = 0; r < s.rows; r++) {
                    for (int64_t a = 0; a < kz; a++) sources[a] = XP + ((z0 + a) * PH + wy + r) * PW + wx;
                    KERNEL(combine_rows)(s.slice + r * s.span, sources, s.tz, kz, s.span);
                }
                slice = s.slice;
                pitch = s.span;
            }
            for (int64_t iy = 0; iy < g->count[1]; iy++) {
                for (int64_t b = 0; b < ky; b++) sources[b] = slice + (iy * sy + b) * pitch;
                KERNEL(combine_rows)(s.row, sources, s.ty, ky, s.span);
                const int64_t at = ((g->first[0] + iz * g->step[0]) * H + g->first[1] + iy * sy) * W + g->first[2];
                KERNEL(blur_and_blend_row)(O + at, X + at, s.row, s.lattice, s.tx, kx, cx, sx, threshold);
            }
        }
    }
    free(s.row);
    return 0;
}

CLONES static int KERNEL(backward)(const Geometry *g, const T *x, const T *grad, T *gx, T *gsrc, int64_t begin,
                                   int64_t end) {
    const int64_t H = g->size[1], W = g->size[2], plane = g->size[0] * H * W;
    const int64_t PH = g->psize[1], PW = g->psize[2], pplane = g->psize[0] * PH * PW;
    const int64_t kz = g->taps_len[0], ky = g->taps_len[1], kx = g->taps_len[2];
    const int64_t cx = g->count[2], sx = g->step[2], sy = g->step[1], wx = g->window[2], wy = g->window[1];
    const T threshold = (T)g->threshold;
    T *targets[MAX_TAPS];
    KERNEL(Scratch) s;
    if (KERNEL(scratch_init)(&s, g) < 0) return -1;
    T *picked = s.lattice + (kx - 1);
    for (int64_t p = begin; p < end; p++) {
        const T *X = x + p * plane, *G = grad + p * plane;
        T *GX = gx + p * plane, *GS = gsrc + p * pplane;
        /* direct path: the output gradient passes where the pixel was kept and stops where it was
           blurred. All of it before any window is added: with border="valid" the windows land in
           grad_x itself. */
        memcpy(GX, G, sizeof(T) * (size_t)plane);
        if (!g->aliased) memset(GS, 0, sizeof(T) * (size_t)pplane);
        for (int64_t iz = 0; iz < g->count[0]; iz++)
            for (int64_t iy = 0; iy < g->count[1]; iy++) {
                const int64_t at = ((g->first[0] + iz * g->step[0]) * H + g->first[1] + iy * sy) * W + g->first[2];
                KERNEL(stop_row)(GX + at, X + at, cx, sx, threshold);
            }
        /* blur path: each blurred pixel's gradient spread over its window, rows first, then (3D)
           the depth taps once per source row */
        for (int64_t iz = 0; iz < g->count[0]; iz++) {
            const int64_t z0 = g->window[0] + iz * g->step[0];
            T *slice = GS + (z0 * PH + wy) * PW + wx;
            int64_t pitch = PW, any = 0;
            if (kz > 1) {
                memset(s.slice, 0, sizeof(T) * (size_t)(s.rows * s.span));
                slice = s.slice;
                pitch = s.span;
            }
            for (int64_t iy = 0; iy < g->count[1]; iy++) {
                const int64_t at = ((g->first[0] + iz * g->step[0]) * H + g->first[1] + iy * sy) * W + g->first[2];
                if (!KERNEL(pick_row)(picked, G + at, X + at, cx, sx, threshold)) continue;
                KERNEL(unblur_row)(s.row, s.lattice, s.tx, kx, cx, sx, s.span);
                for (int64_t b = 0; b < ky; b++) targets[b] = slice + (iy * sy + b) * pitch;
                KERNEL(spread_rows)(targets, s.ty, ky, s.row, s.span);
                any = 1;
            }
            if (kz > 1 && any)
                for (int64_t r = 0; r < s.rows; r++) {
                    for (int64_t a = 0; a < kz; a++) targets[a] = GS + ((z0 + a) * PH + wy + r) * PW + wx;
                    KERNEL(spread_rows)(targets, s.tz, kz, s.slice + r * s.span, s.span);
                }
        }
    }
    free(s.row);
    return 0;
}
