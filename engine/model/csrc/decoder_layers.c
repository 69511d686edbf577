/* Every decoder layer of a decode-only step in one call (CPU), through ctypes (native_decoder.py).
 *
 * Why: at one request per step a Llama layer is ~50 small torch ops (norms, rotary, KV writes,
 * residual adds) around 4 projections, and on a 2-core CPU those ops cost 4-20 us each: with int8
 * weights a SmolLM2 decode step was ~7 ms of weight streaming and ~19 ms of op overhead
 * (docs/benchmarks.md). Here each layer is a few loops over D rows between calls of the
 * projection kernel (narrow_linear.c) and the paged decode-attention kernel (paged_decode.c):
 *     x = rms_norm(h)            qkv = x Wqkv^T (+ b)      q, k = rope(q, k)     pool <- k, v
 *     a = attention(q, pool)     h = h + a Wo^T
 *     x = rms_norm(h)            g, u = x Wgu^T            h = h + (silu(g) * u) Wd^T
 * exactly as llama.py computes a layer. Activations are kept in the engine's dtype between
 * operations and rounded where torch rounds them, so a bfloat16 engine computes what its torch
 * path computes up to the order of float32 sums.
 *
 * Buffers are [D, width] rows in the engine's dtype. Pool rows and slots are as in attention.py:
 * the K slot of (token t, kv head j) in layer l is write_slots[t * KVH + j] + l * 2 * KVH * bs; V
 * is KVH * bs slots further.
 */
#include "narrow_linear.c"
#include "paged_decode.c"

/* One layer; native_decoder.py builds the same struct with ctypes. */
typedef struct {
    const void *input_norm, *post_norm; /* [hidden], engine dtype */
    const narrow_linear *qkv, *o, *gate_up, *down;
} decoder_layer;

typedef struct {
    const decoder_layer *layers;
    int64_t num_layers, hidden, heads, kv_heads, head_dim, intermediate;
    float eps;
    int32_t bf16; /* the engine's dtype is bfloat16 (else float32) */
} decoder;

static inline float get(const void *a, int64_t i, int bf16) {
    return bf16 ? bf16_to_f32(((const uint16_t *)a)[i]) : ((const float *)a)[i];
}
static inline void put(void *a, int64_t i, float v, int bf16) {
    if (bf16)
        ((uint16_t *)a)[i] = f32_to_bf16(v);
    else
        ((float *)a)[i] = v;
}
/* v rounded to the engine's dtype, as a torch op's result would be. */
static inline float rnd(float v, int bf16) { return bf16 ? bf16_to_f32(f32_to_bf16(v)) : v; }

/* x = weight * (h / rms(h)): normalised in float32, cast to the dtype, then scaled (llama.py). */
static void rms_norm_row(const decoder *m, const void *h, const void *weight, void *x, int64_t row) {
    const int64_t n = m->hidden;
    float sum = 0.f;
    for (int64_t j = 0; j < n; j++) {
        const float v = get(h, row * n + j, m->bf16);
        sum += v * v;
    }
    const float inv = 1.f / sqrtf(sum / (float)n + m->eps);
    for (int64_t j = 0; j < n; j++)
        put(x, row * n + j, get(weight, j, m->bf16) * rnd(get(h, row * n + j, m->bf16) * inv, m->bf16), m->bf16);
}

/* Rotate the q and k heads of one qkv row in place: x * cos + rotate_half(x) * sin (rope.py). */
static void rope_row(const decoder *m, void *qkv, const void *cos, const void *sin, int64_t row) {
    const int64_t hd = m->head_dim, half = hd / 2, width = (m->heads + 2 * m->kv_heads) * hd;
    const int b = m->bf16;
    for (int64_t head = 0; head < m->heads + m->kv_heads; head++) {
        const int64_t base = row * width + head * hd;
        for (int64_t i = 0; i < half; i++) {
            const float lo = get(qkv, base + i, b), hi = get(qkv, base + half + i, b);
            const float c_lo = get(cos, row * hd + i, b), s_lo = get(sin, row * hd + i, b);
            const float c_hi = get(cos, row * hd + half + i, b), s_hi = get(sin, row * hd + half + i, b);
            put(qkv, base + i, rnd(lo * c_lo, b) + rnd(-hi * s_lo, b), b);
            put(qkv, base + half + i, rnd(hi * c_hi, b) + rnd(lo * s_hi, b), b);
        }
    }
}

/* h += y, rounded to the dtype. */
static void residual_row(const decoder *m, void *h, const void *y, int64_t row) {
    for (int64_t j = row * m->hidden; j < (row + 1) * m->hidden; j++) put(h, j, get(h, j, m->bf16) + get(y, j, m->bf16), m->bf16);
}

/* act = silu(gate) * up, each rounded to the dtype as torch's two ops are. */
static void silu_mul_row(const decoder *m, const void *gate_up, void *act, int64_t row) {
    const int64_t n = m->intermediate;
    const int b = m->bf16;
    for (int64_t j = 0; j < n; j++) {
        const float g = get(gate_up, row * 2 * n + j, b), u = get(gate_up, row * 2 * n + n + j, b);
        put(act, row * n + j, rnd(g / (1.f + expf(-g)), b) * u, b);
    }
}

/* h: [d, hidden] in the engine's dtype, updated in place; cos, sin: [d, head_dim] for each token's
 * position; pool: the KV pool (float32 or bfloat16, as the engine's dtype); write_slots: [d * KVH]
 * layer-0 K slots; tables: [d, width] block ids; ctx_lens: [d] context lengths including the new
 * token. Returns 0, -1 for shapes the attention kernel refuses, -2 if memory ran out. */
int raypd_decode_layers(const decoder *m, void *h, const void *cos, const void *sin, void *pool,
                        const int64_t *write_slots, const int64_t *tables, const int64_t *ctx_lens, int64_t d,
                        int64_t width, int64_t block_size, int64_t runs_per_block, int num_threads) {
    const int64_t hd = m->head_dim, kvh = m->kv_heads, qkv_width = (m->heads + 2 * kvh) * hd;
    const size_t es = m->bf16 ? 2 : 4;
    const int threads = num_threads < 1 ? 1 : num_threads;
    const int parallel_rows = d >= 8; /* below that, waking the other threads costs more than the rows */
    char *x = malloc(es * (size_t)(d * m->hidden)), *y = malloc(es * (size_t)(d * m->hidden));
    char *qkv = malloc(es * (size_t)(d * qkv_width)), *q = malloc(es * (size_t)(d * m->heads * hd));
    char *a = malloc(es * (size_t)(d * m->heads * hd));
    char *gate_up = malloc(es * (size_t)(d * 2 * m->intermediate)), *act = malloc(es * (size_t)(d * m->intermediate));
    int rc = (x && y && qkv && q && a && gate_up && act) ? 0 : -2;
    for (int64_t l = 0; l < m->num_layers && rc == 0; l++) {
        const decoder_layer *L = &m->layers[l];
#pragma omp parallel for num_threads(threads) if (parallel_rows)
        for (int64_t t = 0; t < d; t++) rms_norm_row(m, h, L->input_norm, x, t);
        if ((rc = raypd_narrow_linear(L->qkv, x, qkv, d, threads)) != 0) break;
#pragma omp parallel for num_threads(threads) if (parallel_rows)
        for (int64_t t = 0; t < d; t++) {
            rope_row(m, qkv, cos, sin, t);
            const char *row = qkv + es * (size_t)(t * qkv_width);
            memcpy(q + es * (size_t)(t * m->heads * hd), row, es * (size_t)(m->heads * hd));
            for (int64_t j = 0; j < kvh; j++) {
                const int64_t k_slot = write_slots[t * kvh + j] + l * 2 * kvh * block_size;
                const int64_t v_slot = k_slot + kvh * block_size;
                memcpy((char *)pool + es * (size_t)(k_slot * hd), row + es * (size_t)((m->heads + j) * hd), es * (size_t)hd);
                memcpy((char *)pool + es * (size_t)(v_slot * hd), row + es * (size_t)((m->heads + kvh + j) * hd),
                       es * (size_t)hd);
            }
        }
        if ((rc = raypd_paged_decode_attention(pool, q, a, tables, ctx_lens, d, width, m->heads, kvh, hd, block_size,
                                               l, runs_per_block, (float)(1.0 / sqrt((double)hd)), threads, m->bf16)) != 0)
            break;
        if ((rc = raypd_narrow_linear(L->o, a, y, d, threads)) != 0) break;
#pragma omp parallel for num_threads(threads) if (parallel_rows)
        for (int64_t t = 0; t < d; t++) {
            residual_row(m, h, y, t);
            rms_norm_row(m, h, L->post_norm, x, t);
        }
        if ((rc = raypd_narrow_linear(L->gate_up, x, gate_up, d, threads)) != 0) break;
#pragma omp parallel for num_threads(threads) if (parallel_rows)
        for (int64_t t = 0; t < d; t++) silu_mul_row(m, gate_up, act, t);
        if ((rc = raypd_narrow_linear(L->down, act, y, d, threads)) != 0) break;
#pragma omp parallel for num_threads(threads) if (parallel_rows)
        for (int64_t t = 0; t < d; t++) residual_row(m, h, y, t);
    }
    free(x);
    free(y);
    free(qkv);
    free(q);
    free(a);
    free(gate_up);
    free(act);
    return rc;
}
