// Q4_K x Q8_K tile of adaspark_app/native/tinyblas_k_quants.inc on one thread, in GMAC/s, against the
// peak of its integer core (independent vpmaddubsw + vpdpwssd zmm pairs). Built and run by q4k_tile.py.
#include <immintrin.h>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <vector>
#include <type_traits>
#define QK_K 256
#define NOINLINE __attribute__((__noinline__))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
typedef uint16_t ggml_fp16_t;
typedef ggml_fp16_t ggml_half;
struct block_q4_K { ggml_half d; ggml_half dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct block_q8_K { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; };
struct block_q6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; ggml_half d; };
static inline float unhalf(ggml_fp16_t h) { return _cvtsh_ss(h); }
#include "tinyblas_k_quants.inc"  // a copy patched by q4k_tile.py (timing-only variants)

static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// peak: independent vpmaddubsw + vpdpwssd zmm pairs (the tile's integer core), per second
static double peak_macs() {
    __m512i a = _mm512_set1_epi8(3), acc[16];
    __m512i q[16];
    for (int i = 0; i < 16; ++i) { acc[i] = _mm512_setzero_si512(); q[i] = _mm512_set1_epi8(i + 1); }
    __m512i sc = _mm512_set1_epi16(2);
    const long iters = 20000000;
    double t0 = now();
    for (long it = 0; it < iters; ++it) {
        for (int i = 0; i < 16; ++i)
            acc[i] = _mm512_dpwssd_epi32(acc[i], sc, _mm512_maddubs_epi16(a, q[i]));
        __asm__ volatile("" : "+v"(a));
    }
    double dt = now() - t0;
    long s = 0;
    for (int i = 0; i < 16; ++i) s += _mm512_reduce_add_epi32(acc[i]);
    if (s == 42) printf("x");
    return iters * 16.0 * 64 / dt;  // 64 int8 MACs per maddubs+dpwssd pair
}

int main(int argc, char **argv) {
    int m = atoi(argv[1]), nsb = atoi(argv[2]), n = atoi(argv[3]), reps = atoi(argv[4]);
    std::vector<block_q4_K> A((size_t)m * nsb);
    std::vector<block_q8_K> B((size_t)n * nsb);
    std::vector<float> C((size_t)m * n);
    srand(1);
    for (auto &b : A) { b.d = 0x3c00; b.dmin = 0x2c00; for (auto &s : b.scales) s = rand(); for (auto &s : b.qs) s = rand(); }
    for (auto &b : B) { b.d = 0.01f; for (auto &s : b.qs) s = rand() % 255 - 127; for (auto &s : b.bsums) s = rand() % 2000 - 1000; }
    tinyBLAS_K_AVX2<block_q4_K> tb(nsb, A.data(), nsb, B.data(), nsb, C.data(), m, 0, 1);
    tb.matmul(m, n);
    double t0 = now();
    for (int r = 0; r < reps; ++r) tb.matmul(m, n);
    double dt = now() - t0;
    double macs = (double)m * n * nsb * QK_K * reps;
    double pk = argc > 5 ? peak_macs() : 0;
    printf("m=%d k=%d n=%d  A %.0f KB B %.0f KB  %.2f GMAC/s  us/call %.1f  peak %.2f GMAC/s  C0 %g\n", m, nsb * QK_K, n,
           A.size() * sizeof(block_q4_K) / 1024.0, B.size() * sizeof(block_q8_K) / 1024.0, macs / dt / 1e9, dt / reps * 1e6, pk / 1e9, C[0]);
}
