/* Decode attention that reads K/V blocks where they lie in the paged pool (float32 or bfloat16, CPU).
 *
 * The torch path gathers every request's context into a padded [D, KVH, W*bs, hd] copy and then
 * runs scaled_dot_product_attention over it: each step writes and reads the whole context twice,
 * plus the padding of the shortest requests up to the longest. Decode attention is memory-bound,
 * so reading each block once, in place, is most of the win (docs/benchmarks.md has the numbers).
 *
 * Pool layout (engine/kv_cache.py): [block, layer, K/V, kv_head, slot, head_dim]; one "run" is one
 * (block, layer, K/V, head) holding bs * hd contiguous floats:
 *     run = block * runs_per_block + layer * 2 * KVH + kv * KVH + head
 * A task is one (request, kv head): its g = H / KVH query heads score every context token, take a
 * softmax, and sum the V rows. Tasks are handed out dynamically because contexts differ in length.
 * A bfloat16 pool (with bfloat16 q and out) is read the same way: each K or V row is widened to
 * float32 (bf16 is float32's top half) just before use, and every sum is float32.
 * Called through ctypes, which releases the GIL for the duration.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256

typedef struct {
    const void *pool, *q;
    void *out;
    const int64_t *tables, *ctx_lens;
    int64_t width, heads, kv_heads, head_dim, block_size, layer_run, runs_per_block;
    float scale;
    int bf16; /* pool, q and out are bfloat16 */
} decode_job;

/* Index of the first element of a run, in elements of the pool. */
static int64_t run_start(const decode_job *j, int64_t block, int64_t run_offset) {
    return (block * j->runs_per_block + j->layer_run + run_offset) * j->block_size * j->head_dim;
}

/* n elements from `base + start` as float32: in place for a float32 pool, else widened into tmp. */
static const float *as_f32(const decode_job *j, const void *base, int64_t start, int64_t n, float *tmp) {
    if (!j->bf16) return (const float *)base + start;
    const uint16_t *h = (const uint16_t *)base + start;
    for (int64_t x = 0; x < n; x++) {
        const uint32_t u = (uint32_t)h[x] << 16;
        memcpy(tmp + x, &u, sizeof u);
    }
    return tmp;
}

static uint16_t to_bf16(float f) { /* round to nearest even, as torch's .to(bfloat16) */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static void one_task(const decode_job *j, int64_t task, float *scores) {
    const int64_t g = j->heads / j->kv_heads, hd = j->head_dim, bs = j->block_size;
    const int64_t d = task / j->kv_heads, kh = task % j->kv_heads, ctx = j->ctx_lens[d];
    const int64_t *table = j->tables + d * j->width;
    const int64_t blocks = (ctx + bs - 1) / bs;
    float max_score[MAX_GROUP], denom[MAX_GROUP], acc[MAX_GROUP][MAX_HEAD_DIM];
    float q_f32[MAX_GROUP * MAX_HEAD_DIM], row[MAX_HEAD_DIM];
    const float *q = as_f32(j, j->q, (d * j->heads + kh * g) * hd, g * hd, q_f32);

    for (int64_t i = 0; i < g; i++) max_score[i] = -INFINITY;
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t k = run_start(j, table[b], kh);
        const int64_t n = ctx - b * bs < bs ? ctx - b * bs : bs;
        for (int64_t s = 0; s < n; s++) {
            const float *k_row = as_f32(j, j->pool, k + s * hd, hd, row);
            for (int64_t i = 0; i < g; i++) {
                const float *q_row = q + i * hd;
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int64_t x = 0; x < hd; x++) dot += q_row[x] * k_row[x];
                dot *= j->scale;
                scores[i * ctx + b * bs + s] = dot;
                if (dot > max_score[i]) max_score[i] = dot;
            }
        }
    }
    for (int64_t i = 0; i < g; i++) {
        float sum = 0.f, *row = scores + i * ctx;
        for (int64_t c = 0; c < ctx; c++) {
            row[c] = expf(row[c] - max_score[i]);
            sum += row[c];
        }
        denom[i] = sum;
        memset(acc[i], 0, sizeof(float) * hd);
    }
    for (int64_t b = 0; b < blocks; b++) {
        const int64_t v = run_start(j, table[b], j->kv_heads + kh);
        const int64_t n = ctx - b * bs < bs ? ctx - b * bs : bs;
        for (int64_t s = 0; s < n; s++) {
            const float *v_row = as_f32(j, j->pool, v + s * hd, hd, row);
            for (int64_t i = 0; i < g; i++) {
                const float p = scores[i * ctx + b * bs + s];
                float *a = acc[i];
#pragma omp simd
                for (int64_t x = 0; x < hd; x++) a[x] += p * v_row[x];
            }
        }
    }
    const int64_t out = (d * j->heads + kh * g) * hd;
    for (int64_t i = 0; i < g; i++) {
        const float inv = 1.f / denom[i];
        for (int64_t x = 0; x < hd; x++) {
            if (j->bf16)
                ((uint16_t *)j->out)[out + i * hd + x] = to_bf16(acc[i][x] * inv);
            else
                ((float *)j->out)[out + i * hd + x] = acc[i][x] * inv;
        }
    }
}

/* q: [D, H, hd]; out: [D, H, hd]; tables: [D, width] block ids; ctx_lens: [D], 1 <= ctx <= width*bs.
 * pool, q and out are float32, or all bfloat16 when bf16 is set.
 * Returns 0, or -1 for shapes it does not handle (the caller falls back), -2 if memory ran out. */
int raypd_paged_decode_attention(const void *pool, const void *q, void *out, const int64_t *tables,
                                 const int64_t *ctx_lens, int64_t num_decodes, int64_t width, int64_t heads,
                                 int64_t kv_heads, int64_t head_dim, int64_t block_size, int64_t layer,
                                 int64_t runs_per_block, float scale, int num_threads, int bf16) {
    if (kv_heads < 1 || heads % kv_heads != 0 || heads / kv_heads > MAX_GROUP || head_dim > MAX_HEAD_DIM)
        return -1;
    const decode_job job = {pool, q, out, tables, ctx_lens, width, heads, kv_heads, head_dim, block_size,
                            layer * 2 * kv_heads, runs_per_block, scale, bf16 != 0};
    const int64_t tasks = num_decodes * kv_heads;
    int failed = 0;
    /* The same OpenMP runtime as torch's (libgomp.so.1, which torch loads first): this region runs
     * on torch's worker threads instead of competing with them while they spin after a matmul. */
#pragma omp parallel num_threads(num_threads < 1 ? 1 : num_threads) reduction(| : failed)
    {
        float *scores = malloc(sizeof(float) * (heads / kv_heads) * width * block_size);
        if (scores == NULL) failed = 1;
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            if (scores != NULL) one_task(&job, task, scores);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
