// Q4_1 x Q8_1 tinyBLAS kernel (adaspark_app/native/tinyblas_q4_1.inc) at two revisions, one thread:
// every output compared bit for bit, and GMAC/s (int8 multiply-adds per second) of each.
// Built and run by q4_1_tile.py: q4_1_tile M KB N [SECONDS]; random weights and activations.
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <vector>
#define NOINLINE __attribute__((__noinline__))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
typedef uint16_t ggml_fp16_t;
struct block_q4_1 { ggml_fp16_t d, m; uint8_t qs[16]; };
struct block_q8_1 { ggml_fp16_t d, s; int8_t qs[32]; };
static inline float unhalf(ggml_fp16_t h) { return _cvtsh_ss(h); }
inline float hsum(__m128 x) { x = _mm_add_ps(x, _mm_movehl_ps(x, x)); x = _mm_add_ss(x, _mm_movehdup_ps(x)); return _mm_cvtss_f32(x); }
inline float hsum(__m256 x) { return hsum(_mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x))); }
namespace base {
#include "base.inc"  // the kernel at the reference commit (q4_1_tile.py writes it)
}
namespace head {
#include "head.inc"  // the kernel in this checkout
}
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static ggml_fp16_t h(float f) { return _cvtss_sh(f, 0); }
int main(int argc, char **argv) {
    int m = atoi(argv[1]), kb = atoi(argv[2]), n = atoi(argv[3]); double secs = argc > 4 ? atof(argv[4]) : 0.5;
    std::vector<block_q4_1> A((size_t)m * kb);
    std::vector<block_q8_1> B((size_t)n * kb);
    std::vector<float> C0((size_t)m * n), C1((size_t)m * n);
    srand(1);
    for (auto &b : A) { b.d = h((rand() % 1000) / 50000.f + 1e-4f); b.m = h(-(rand() % 1000) / 30000.f); for (auto &q : b.qs) q = rand(); }
    for (auto &b : B) { b.d = h((rand() % 1000) / 40000.f + 1e-4f); int s = 0; for (auto &q : b.qs) { q = rand() % 255 - 127; s += q; } b.s = h(s * 0.01f); }
    base::tinyBLAS_Q4_1_AVX<float> t0(kb, A.data(), kb, B.data(), kb, C0.data(), m, 0, 1);
    head::tinyBLAS_Q4_1_AVX<float> t1(kb, A.data(), kb, B.data(), kb, C1.data(), m, 0, 1);
    t0.matmul(m, n); t1.matmul(m, n);
    long bad = 0; for (size_t i = 0; i < C0.size(); ++i) if (memcmp(&C0[i], &C1[i], 4)) ++bad;
    double best[2] = {1e9, 1e9};
    for (int rep = 0; rep < 5; ++rep) for (int v = 0; v < 2; ++v) {
        long it = 0; double t = now(), e;
        do { if (v) t1.matmul(m, n); else t0.matmul(m, n); ++it; e = now() - t; } while (e < secs / 10);
        if (e / it < best[v]) best[v] = e / it;
    }
    double macs = (double)m * n * kb * 32;
    printf("m %d kb %d n %d base %.2f head %.2f head/base %.3f mismatches %ld\n",
           m, kb, n, macs / best[0] / 1e9, macs / best[1] / 1e9, best[1] / best[0], bad);
    return bad != 0;
}
