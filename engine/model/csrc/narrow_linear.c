/* y = x @ W^T * scale + bias for weights stored narrower than float32, on CPU. Called through
 * ctypes (native_linear.py).
 *
 * Why: a decode step streams every weight once, so at a few rows per step a CPU projection runs at
 * the memory's pace and bytes per weight are the time (docs/benchmarks.md). torch has no fast path
 * for narrow weights on a CPU without AVX-512 (its bf16 and int8 CPU matmuls run 2-10x slower than
 * float32 there), and on such a CPU the work of widening each weight is itself the limit, so:
 *   bfloat16 weights: widened to float32 in registers (zero-extend, shift left by 16: bf16 is
 *     float32's top half) and multiplied with float32 activations by FMA;
 *   int8 weights (one scale per output row): the activations are rounded to int16 with one scale
 *     per row (error 2^-15 of the row's largest value, about 1/256 of the weights' own rounding)
 *     and multiplied in integers (AVX2 vpmaddwd: 16 products per instruction, twice the rate of
 *     float FMAs). The integer sums are exact, so the result does not depend on the order of work.
 *
 * Layout (native_linear.py packs it): W is n_padded x k_padded, n_padded = n rounded up to NR rows
 * and k_padded = k rounded up to 16, the padding zero, stored tile by tile so a tile reads its
 * weights in one sequential stream (4 short row streams defeat the hardware prefetcher):
 *     [n_padded / NR][k_padded / 16][NR][16]     (element (r, i) of a tile: at(r, i) below)
 * x is [m, k] and y [m, n], both float32 or both bfloat16 (the engine's dtype). Work goes in tiles of NR weight rows x up to MR
 * activation rows; each accumulator is a vector of partial sums along k, added up at the end.
 *   m <= MR (decode): each thread streams a contiguous share of the weight rows once.
 *   m >  MR (prefill chunks, big batches): a task is (NR weight rows, up to MC activation rows); it
 *   widens its weight rows once into a buffer that stays in L1 and runs the tiles over it.
 * The parallel region runs on torch's OpenMP threads (native_build.py).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define RAYPD_AVX2 1
#endif

#define NR 4       /* weight rows per tile */
#define MR 3       /* activation rows per tile: NR * MR accumulators + MR activations + 1 weight = 16 registers */
#define MC 48      /* activation rows per task when m > MR: they stay in L2 while the task runs */
#define SPAN 4096  /* int32 lanes hold SPAN / 16 sums of two products of 127 * 32767 without overflow */
#define GROUP 32   /* columns per scale and offset of grouped int8 weights */
#define I16_MAX 32767.f
#ifndef PREFETCH
#define PREFETCH 2048 /* bytes ahead in a thread's weight stream: 12.6 -> 18-19 GB/s of int8 on 2 Zen cores */
#endif

enum { WEIGHT_F32 = 0, WEIGHT_BF16 = 1, WEIGHT_I8 = 2, WEIGHT_I16 = 3 /* int8 rows widened in a task's buffer */ };

/* One packed projection; native_linear.py builds the same struct with ctypes. */
typedef struct {
    const void *weight; /* [n_padded, k_padded] of weight_kind */
    const float *scale; /* [n] or NULL */
    const float *bias;  /* [n] or NULL */
    int64_t n, k, n_padded, k_padded;
    int32_t weight_kind, activation_bf16;
    /* int8 in groups of GROUP columns (groups = k_padded / GROUP, else 0): w = q * scale_g + offset_g.
     * group_scale is [n_padded / NR][groups][NR] (a tile reads its rows' scales in one stream),
     * group_offset [n_padded][groups]. */
    const float *group_scale, *group_offset;
    int64_t groups;
} narrow_linear;

static inline float bf16_to_f32(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) { /* round to nearest even, as torch's .to(bfloat16) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* keep a NaN a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Offset of weight (row r, column i) from the start of its tile. */
static inline int64_t at(int r, int64_t i) { return (i >> 4) * (NR * 16) + r * 16 + (i & 15); }

/* bfloat16 rows keep each group of 16 columns in the order 0-3, 8-11, 4-7, 12-15: AVX2's
 * unpacklo/unpackhi (which work within 128-bit lanes) then widen one 32-byte load into columns
 * 0-7 and 8-15 with one instruction each, against two per 8 columns by zero-extend and shift. */
static inline int64_t bf16_slot(int64_t p) { return ((p >> 2) == 1 || (p >> 2) == 2) ? p ^ 12 : p; }
static inline int64_t stored_at(int r, int64_t i, int kind) {
    return kind == WEIGHT_BF16 ? at(r, i & ~(int64_t)15) + bf16_slot(i & 15) : at(r, i);
}

static inline float activation_at(const narrow_linear *p, const void *x, int64_t i) {
    return p->activation_bf16 ? bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
}

static inline float weight_at(const void *w, int kind, int64_t i) {
    return kind == WEIGHT_BF16 ? bf16_to_f32(((const uint16_t *)w)[i]) : ((const float *)w)[i];
}

static inline int32_t int_weight_at(const void *w, int kind, int64_t i) {
    return kind == WEIGHT_I16 ? ((const int16_t *)w)[i] : ((const int8_t *)w)[i];
}

/* ---- float path: float32 / bfloat16 weights, float32 activations ------------------------------- */
#ifdef RAYPD_AVX2
typedef __m256 vec;
#define LANES 8
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vec v) { _mm256_storeu_ps(p, v); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec vload_weight(const void *w, int kind, int64_t i) { /* float32 weights */
    (void)kind;
    return _mm256_loadu_ps((const float *)w + i);
}
/* 16 bfloat16 weights stored from offset s (one row's group of 16 columns) as columns 0-7 and 8-15. */
static inline void vload_bf16_group(const void *w, int64_t s, vec *lo, vec *hi) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)((const uint16_t *)w + s)), zero = _mm256_setzero_si256();
    *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, v));
    *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, v));
}
static inline float vsum(vec v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
#else /* portable: one lane, the same order of work */
typedef float vec;
#define LANES 1
static inline vec vzero(void) { return 0.f; }
static inline vec vload(const float *p) { return *p; }
static inline void vstore(float *p, vec v) { *p = v; }
static inline vec vfma(vec a, vec b, vec c) { return a * b + c; }
static inline vec vload_weight(const void *w, int kind, int64_t i) { return weight_at(w, kind, i); }
static inline float vsum(vec v) { return v; }
#endif

/* out[m][r] = sum_i x[m * kp + i] * w[at(r, i)]. Inlined with constant mr and kind, so the
 * accumulators live in registers. */
static inline __attribute__((always_inline)) void float_tile(const float *x, int mr, const void *w, int kind,
                                                             int64_t kp, float out[MR][NR]) {
    vec acc[MR][NR];
    for (int m = 0; m < MR; m++)
        for (int r = 0; r < NR; r++) acc[m][r] = vzero();
#ifdef RAYPD_AVX2
    if (kind == WEIGHT_BF16) {
        vec acc_hi[MR][NR]; /* columns 8-15 of each group: two chains of FMAs per accumulator pair */
        for (int m = 0; m < MR; m++)
            for (int r = 0; r < NR; r++) acc_hi[m][r] = vzero();
        for (int64_t i = 0; i < kp; i += 16) {
            _mm_prefetch((const char *)w + 2 * at(0, i) + PREFETCH, _MM_HINT_T0); /* 2 lines per group */
            _mm_prefetch((const char *)w + 2 * at(0, i) + PREFETCH + 64, _MM_HINT_T0);
            for (int r = 0; r < NR; r++) {
                vec lo, hi;
                vload_bf16_group(w, at(r, i), &lo, &hi);
                for (int m = 0; m < mr; m++) {
                    acc[m][r] = vfma(vload(x + m * kp + i), lo, acc[m][r]);
                    acc_hi[m][r] = vfma(vload(x + m * kp + i + 8), hi, acc_hi[m][r]);
                }
            }
        }
        for (int m = 0; m < mr; m++)
            for (int r = 0; r < NR; r++) acc[m][r] = _mm256_add_ps(acc[m][r], acc_hi[m][r]);
    } else
#endif
    for (int64_t i = 0; i < kp; i += LANES) {
        vec xv[MR];
        for (int m = 0; m < mr; m++) xv[m] = vload(x + m * kp + i);
        for (int r = 0; r < NR; r++) {
            const vec wv = vload_weight(w, kind, stored_at(r, i, kind));
            for (int m = 0; m < mr; m++) acc[m][r] = vfma(xv[m], wv, acc[m][r]);
        }
    }
    for (int m = 0; m < mr; m++)
        for (int r = 0; r < NR; r++) out[m][r] = vsum(acc[m][r]);
}

/* ---- integer path: int8 weights (or their int16 widening), int16 activations -------------------- */
#ifdef RAYPD_AVX2
static inline __m256i iload_weight(const void *w, int kind, int64_t i) {
    if (kind == WEIGHT_I16) return _mm256_loadu_si256((const __m256i *)((const int16_t *)w + i));
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)((const int8_t *)w + i)));
}
static inline int64_t isum(__m256i v) {
    int32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, v);
    int64_t s = 0;
    for (int i = 0; i < 8; i++) s += lanes[i];
    return s;
}
#endif

static inline __attribute__((always_inline)) void int_tile(const int16_t *x, int mr, const void *w, int kind,
                                                           int64_t kp, int64_t out[MR][NR]) {
    for (int m = 0; m < mr; m++)
        for (int r = 0; r < NR; r++) out[m][r] = 0;
#ifdef RAYPD_AVX2
    for (int64_t start = 0; start < kp; start += SPAN) {
        const int64_t end = start + SPAN < kp ? start + SPAN : kp;
        __m256i acc[MR][NR];
        for (int m = 0; m < MR; m++)
            for (int r = 0; r < NR; r++) acc[m][r] = _mm256_setzero_si256();
        for (int64_t i = start; i < end; i += 16) {
            if (kind == WEIGHT_I8) _mm_prefetch((const char *)w + at(0, i) + PREFETCH, _MM_HINT_T0);
            __m256i xv[MR];
            for (int m = 0; m < mr; m++) xv[m] = _mm256_loadu_si256((const __m256i *)(x + m * kp + i));
            for (int r = 0; r < NR; r++) {
                const __m256i wv = iload_weight(w, kind, at(r, i));
                for (int m = 0; m < mr; m++) acc[m][r] = _mm256_add_epi32(acc[m][r], _mm256_madd_epi16(xv[m], wv));
            }
        }
        for (int m = 0; m < mr; m++)
            for (int r = 0; r < NR; r++) out[m][r] += isum(acc[m][r]);
    }
#else
    for (int64_t i = 0; i < kp; i++)
        for (int r = 0; r < NR; r++) {
            const int32_t wv = int_weight_at(w, kind, at(r, i));
            for (int m = 0; m < mr; m++) out[m][r] += (int64_t)x[m * kp + i] * wv;
        }
#endif
}

/* Grouped int8: out[m][r] = sum_g scale[g][r] * sum_{i in g} x[m][i] * q[r][i] (offsets come later).
 * Each group's integer sum is exact; the sums over groups are float32, in the same order for any m. */
static inline __attribute__((always_inline)) void group_tile(const int16_t *x, int mr, const void *w, int kind,
                                                             const float *scale, int64_t kp, float out[MR][NR]) {
#ifdef RAYPD_AVX2
    __m256 acc[MR][NR];
    for (int m = 0; m < MR; m++)
        for (int r = 0; r < NR; r++) acc[m][r] = _mm256_setzero_ps();
    for (int64_t i = 0, g = 0; i < kp; i += GROUP, g++) {
        if (kind == WEIGHT_I8) { /* a group of the tile is 2 lines of int8 */
            _mm_prefetch((const char *)w + at(0, i) + PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)w + at(0, i) + PREFETCH + 64, _MM_HINT_T0);
        }
        for (int r = 0; r < NR; r++) {
            const __m256i w0 = iload_weight(w, kind, at(r, i)), w1 = iload_weight(w, kind, at(r, i + 16));
            const __m256 sc = _mm256_set1_ps(scale[g * NR + r]);
            for (int m = 0; m < mr; m++) {
                const __m256i t = _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(x + m * kp + i)), w0),
                    _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(x + m * kp + i + 16)), w1));
                acc[m][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), sc, acc[m][r]);
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int r = 0; r < NR; r++) out[m][r] = vsum(acc[m][r]);
#else
    for (int m = 0; m < mr; m++)
        for (int r = 0; r < NR; r++) out[m][r] = 0.f;
    for (int64_t i = 0, g = 0; i < kp; i += GROUP, g++)
        for (int r = 0; r < NR; r++)
            for (int m = 0; m < mr; m++) {
                int64_t sum = 0;
                for (int64_t j = i; j < i + GROUP; j++) sum += (int64_t)x[m * kp + j] * int_weight_at(w, kind, at(r, j));
                out[m][r] += (float)sum * scale[g * NR + r];
            }
#endif
}

/* Row i of x as int16 (zero-padded to kp) and its scale: x[i, j] ~ q[j] * scale. */
static void quantize_row(const narrow_linear *p, const void *x, int64_t i, int16_t *q, float *scale, float *group_sums) {
    for (int64_t g = 0; g < p->groups; g++) { /* the offsets multiply sum_k x[k] over each group */
        float sum = 0.f;
        for (int64_t j = g * GROUP; j < (g + 1) * GROUP && j < p->k; j++) sum += activation_at(p, x, i * p->k + j);
        group_sums[g] = sum;
    }
    float amax = 0.f;
    for (int64_t j = 0; j < p->k; j++) {
        const float v = fabsf(activation_at(p, x, i * p->k + j));
        amax = v > amax || v != v ? v : amax;
    }
    if (!(amax < INFINITY)) { /* inf or NaN in the row: the outputs are NaN, as a float matmul's would be */
        memset(q, 0, sizeof(int16_t) * (size_t)p->k_padded);
        *scale = NAN;
        return;
    }
    const float inv = amax > 0.f ? I16_MAX / amax : 0.f;
    for (int64_t j = 0; j < p->k; j++) {
        const float v = nearbyintf(activation_at(p, x, i * p->k + j) * inv);
        q[j] = (int16_t)(v > I16_MAX ? I16_MAX : v < -I16_MAX ? -I16_MAX : v);
    }
    for (int64_t j = p->k; j < p->k_padded; j++) q[j] = 0;
    *scale = amax > 0.f ? amax / I16_MAX : 0.f;
}

static void widen_row(const narrow_linear *p, const void *x, int64_t i, float *row) {
    for (int64_t j = 0; j < p->k; j++) row[j] = activation_at(p, x, i * p->k + j);
    for (int64_t j = p->k; j < p->k_padded; j++) row[j] = 0.f;
}

/* ---- tiles and their stores ----------------------------------------------------------------------- */
typedef struct {
    const narrow_linear *p;
    const float *xf;       /* float path: [m, kp] activations */
    const int16_t *xq;     /* integer path: [m, kp] activations and their row scales */
    const float *xq_scale;
    const float *group_sums; /* grouped int8: [m, groups] sums of x over each group */
    void *y;
} job;

static void store(const job *j, int64_t row, int mr, int64_t col0, float out[MR][NR]) {
    const narrow_linear *p = j->p;
    for (int m = 0; m < mr; m++) {
        for (int r = 0; r < NR && col0 + r < p->n; r++) {
            const int64_t col = col0 + r;
            float v = out[m][r];
            if (p->scale) v *= p->scale[col];
            if (p->bias) v += p->bias[col];
            if (p->activation_bf16)
                ((uint16_t *)j->y)[(row + m) * p->n + col] = f32_to_bf16(v);
            else
                ((float *)j->y)[(row + m) * p->n + col] = v;
        }
    }
}

#define FLOAT_TILE(KIND)                                    \
    switch (mr) {                                           \
    case 1: float_tile(x, 1, w, KIND, kp, out); break;      \
    case 2: float_tile(x, 2, w, KIND, kp, out); break;      \
    default: float_tile(x, MR, w, KIND, kp, out); break;    \
    }
#define GROUP_TILE(KIND)                                                \
    switch (mr) {                                                       \
    case 1: group_tile(xq, 1, w, KIND, scale, kp, out); break;         \
    case 2: group_tile(xq, 2, w, KIND, scale, kp, out); break;         \
    default: group_tile(xq, MR, w, KIND, scale, kp, out); break;       \
    }
#define INT_TILE(KIND)                                      \
    switch (mr) {                                           \
    case 1: int_tile(xq, 1, w, KIND, kp, sums); break;      \
    case 2: int_tile(xq, 2, w, KIND, kp, sums); break;      \
    default: int_tile(xq, MR, w, KIND, kp, sums); break;    \
    }

/* Rows [row, row + mr) of y, columns [col0, col0 + NR), from weight rows w (of `kind`). */
static void tile(const job *j, int64_t row, int mr, int64_t col0, const void *w, int kind) {
    const int64_t kp = j->p->k_padded;
    float out[MR][NR];
    const narrow_linear *p = j->p;
    if ((kind == WEIGHT_I8 || kind == WEIGHT_I16) && p->groups > 0) {
        const int16_t *xq = j->xq + row * kp;
        const float *scale = p->group_scale + (col0 / NR) * p->groups * NR;
        if (kind == WEIGHT_I8) {
            GROUP_TILE(WEIGHT_I8)
        } else {
            GROUP_TILE(WEIGHT_I16)
        }
        for (int m = 0; m < mr; m++) {
            const float *sums = j->group_sums + (row + m) * p->groups;
            for (int r = 0; r < NR; r++) {
                const float *offset = p->group_offset + (col0 + r) * p->groups;
                float zero_term = 0.f;
#pragma omp simd reduction(+ : zero_term)
                for (int64_t g = 0; g < p->groups; g++) zero_term += offset[g] * sums[g];
                out[m][r] = out[m][r] * j->xq_scale[row + m] + zero_term;
            }
        }
    } else if (kind == WEIGHT_I8 || kind == WEIGHT_I16) {
        const int16_t *xq = j->xq + row * kp;
        int64_t sums[MR][NR];
        if (kind == WEIGHT_I8) {
            INT_TILE(WEIGHT_I8)
        } else {
            INT_TILE(WEIGHT_I16)
        }
        for (int m = 0; m < mr; m++)
            for (int r = 0; r < NR; r++) out[m][r] = (float)((double)sums[m][r] * j->xq_scale[row + m]);
    } else {
        const float *x = j->xf + row * kp;
        if (kind == WEIGHT_BF16) {
            FLOAT_TILE(WEIGHT_BF16)
        } else {
            FLOAT_TILE(WEIGHT_F32)
        }
    }
    store(j, row, mr, col0, out);
}

static const void *weight_rows(const narrow_linear *p, int64_t row) {
    const size_t size = p->weight_kind == WEIGHT_F32 ? 4 : p->weight_kind == WEIGHT_BF16 ? 2 : 1;
    return (const char *)p->weight + (size_t)row * (size_t)p->k_padded * size;
}

/* NR weight rows widened into buf (float32, or int16 for int8 weights); returns its kind. */
static int widen_weights(const narrow_linear *p, const void *w, void *buf) {
    const int64_t count = NR * p->k_padded;
    if (p->weight_kind == WEIGHT_I8) {
        for (int64_t i = 0; i < count; i++) ((int16_t *)buf)[i] = ((const int8_t *)w)[i];
        return WEIGHT_I16;
    }
    /* Into plain at() order: each stored group of 16 is one row's 16 columns. */
    for (int64_t s = 0; s < count; s += 16) {
#ifdef RAYPD_AVX2
        vec lo, hi;
        vload_bf16_group(w, s, &lo, &hi);
        vstore((float *)buf + s, lo);
        vstore((float *)buf + s + 8, hi);
#else
        for (int64_t j = 0; j < 16; j++) ((float *)buf)[s + j] = weight_at(w, WEIGHT_BF16, s + bf16_slot(j));
#endif
    }
    return WEIGHT_F32;
}

/* x: [m, k], y: [m, n]. Returns 0, or -2 if memory ran out. */
int raypd_narrow_linear(const narrow_linear *p, const void *x, void *y, int64_t m, int num_threads) {
    const int64_t kp = p->k_padded, blocks = p->n_padded / NR;
    const int integer = p->weight_kind == WEIGHT_I8;
    job j = {p, (const float *)x, NULL, NULL, NULL, y};
    int16_t *xq = NULL;
    float *xq_scale = NULL, *xf = NULL, *group_sums = NULL;
    /* The float path reads x in place when it already is float32 rows of kp. */
    const int prepare = integer || p->activation_bf16 || p->k != kp;
    if (integer) {
        xq = malloc(sizeof(int16_t) * (size_t)(m * kp));
        xq_scale = malloc(sizeof(float) * (size_t)m);
        group_sums = malloc(sizeof(float) * (size_t)(m * (p->groups > 0 ? p->groups : 1)));
        j.xq = xq;
        j.xq_scale = xq_scale;
        j.group_sums = group_sums;
    } else if (prepare) {
        xf = malloc(sizeof(float) * (size_t)(m * kp));
        j.xf = xf;
    }
    if ((integer && (xq == NULL || xq_scale == NULL || group_sums == NULL)) || (!integer && prepare && xf == NULL)) {
        free(xq);
        free(xq_scale);
        free(group_sums);
        free(xf);
        return -2;
    }
    int failed = 0;
    const int threads = num_threads < 1 ? 1 : num_threads;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        if (prepare) {
#pragma omp for schedule(static)
            for (int64_t i = 0; i < m; i++) {
                if (integer)
                    quantize_row(p, x, i, xq + i * kp, xq_scale + i, group_sums + i * p->groups);
                else
                    widen_row(p, x, i, xf + i * kp);
            }
        }
        if (m <= MR) {
#pragma omp for schedule(static)
            for (int64_t b = 0; b < blocks; b++) tile(&j, 0, (int)m, b * NR, weight_rows(p, b * NR), p->weight_kind);
        } else {
            void *buf = NULL;
            if (p->weight_kind != WEIGHT_F32 && (buf = malloc(sizeof(float) * NR * (size_t)kp)) == NULL) failed = 1;
            const int64_t chunks = (m + MC - 1) / MC;
#pragma omp for collapse(2) schedule(static)
            for (int64_t c = 0; c < chunks; c++) {
                for (int64_t b = 0; b < blocks; b++) {
                    if (p->weight_kind != WEIGHT_F32 && buf == NULL) continue;
                    const void *w = weight_rows(p, b * NR);
                    const int kind = buf != NULL ? widen_weights(p, w, buf) : p->weight_kind;
                    const int64_t end = (c + 1) * MC < m ? (c + 1) * MC : m;
                    for (int64_t row = c * MC; row < end; row += MR)
                        tile(&j, row, end - row < MR ? (int)(end - row) : MR, b * NR, buf != NULL ? buf : w, kind);
                }
            }
            free(buf);
        }
    }
    free(xq);
    free(xq_scale);
    free(group_sums);
    free(xf);
    return failed ? -2 : 0;
}
