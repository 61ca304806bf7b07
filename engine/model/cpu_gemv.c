// Decode-shaped products on the CPU that read each weight byte once, in the format it is stored in:
//   fp8_gemv:  y[r, o] = scale[o] * sum_i x[r, i] * fp8_e4m3fn(w[o, i])   (+ bias[o])
//   bf16_gemv: y[r, o] = sum_i x[r, i] * bf16(w[o, i])
// x and y are float32, rows-major; w is [out, in] row-major. A decode step is memory-bound, so the work
// is converting weights in registers as they stream in, never writing a float copy.
//
// fp8 e4m3fn -> float32 exactly, subnormals included, with no table and no denormal arithmetic: the byte
// s.eeee.mmm shifted into a half's bit positions (sign to bit 15, eeee to bits 10-13, mmm to bits 7-9)
// is the half-precision number of the same value times 2^-8 (half's exponent bias is 15, e4m3's 7), which
// the F16C conversion widens exactly; the 2^8 goes into the scale. Built by engine/model/cpu_gemv.py with
// -march=native on the machine that runs it: AVX-512, AVX2 + F16C, or portable C.
#include <stdint.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define MAX_ROWS 8  // rows of x served in one pass over the weights (decode batches); more are looped

const char *drafter_gemv_isa(void) {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
    return "avx512";
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    return "avx2";
#else
    return "portable";
#endif
}

static float fp8_to_float(uint8_t b) {  // the portable path's conversion, exact
    int exponent = (b >> 3) & 15, mantissa = b & 7;
    float magnitude = exponent ? (float)(8 + mantissa) * (float)(1 << exponent) / 1024.0f
                               : (float)mantissa / 512.0f;
    return (b & 0x80) ? -magnitude : magnitude;
}

static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__F16C__)
#define LANES 16
typedef __m512 vec;
static inline vec vzero(void) { return _mm512_setzero_ps(); }
static inline vec vload(const float *p) { return _mm512_loadu_ps(p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
static inline float vsum(vec a) { return _mm512_reduce_add_ps(a); }
static inline vec _add(vec a, vec b) { return _mm512_add_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm512_mul_ps(a, b); }
static inline vec vset1(float a) { return _mm512_set1_ps(a); }
static inline void vstore(float *p, vec a) { _mm512_storeu_ps(p, a); }
static inline vec load_fp8(const uint8_t *p) {  // 16 weights, each times 2^-8
    __m256i h = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)p));
    h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xBFFF));
    return _mm512_cvtph_ps(h);
}
static inline vec load_bf16(const uint16_t *p) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define LANES 8
typedef __m256 vec;
static inline vec vzero(void) { return _mm256_setzero_ps(); }
static inline vec vload(const float *p) { return _mm256_loadu_ps(p); }
static inline vec vfma(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
static inline vec _add(vec a, vec b) { return _mm256_add_ps(a, b); }
static inline vec vmul(vec a, vec b) { return _mm256_mul_ps(a, b); }
static inline vec vset1(float a) { return _mm256_set1_ps(a); }
static inline void vstore(float *p, vec a) { _mm256_storeu_ps(p, a); }
static inline float vsum(vec a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}
static inline vec load_fp8(const uint8_t *p) {
    __m128i h = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)p));
    h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xBFFF));
    return _mm256_cvtph_ps(h);
}
static inline vec load_bf16(const uint16_t *p) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}
#endif

#ifdef LANES
// One output row against ROWS rows of x (a compile-time constant), with UNROLL independent accumulators per
// x row so the fused multiply-adds never wait on each other. One output row at a time keeps the weights
// one sequential stream: interleaving several rows' streams halved what the prefetchers delivered.
#define ROW(NAME, WTYPE, LOADW, FIX)                                                                    \
    static inline __attribute__((always_inline)) void NAME(const float *x, int64_t in, const WTYPE *w,   \
                                                           float *sums, const int ROWS) {               \
        const int UNROLL = ROWS <= 2 ? 4 : ROWS <= 4 ? 2 : 1;                                           \
        vec acc[MAX_ROWS][4];                                                                           \
        for (int r = 0; r < ROWS; r++)                                                                  \
            for (int u = 0; u < UNROLL; u++) acc[r][u] = vzero();                                       \
        int64_t i = 0;                                                                                  \
        for (; i + UNROLL * LANES <= in; i += UNROLL * LANES)                                           \
            for (int u = 0; u < UNROLL; u++) {                                                          \
                vec wv = LOADW(w + i + u * LANES);                                                      \
                for (int r = 0; r < ROWS; r++)                                                          \
                    acc[r][u] = vfma(wv, vload(x + r * in + i + u * LANES), acc[r][u]);                 \
            }                                                                                           \
        for (; i + LANES <= in; i += LANES) {                                                           \
            vec wv = LOADW(w + i);                                                                      \
            for (int r = 0; r < ROWS; r++) acc[r][0] = vfma(wv, vload(x + r * in + i), acc[r][0]);      \
        }                                                                                               \
        for (int r = 0; r < ROWS; r++) {                                                                \
            for (int u = 1; u < UNROLL; u++) acc[r][0] = _add(acc[r][0], acc[r][u]);                    \
            float s = vsum(acc[r][0]);                                                                  \
            for (int64_t j = i; j < in; j++) s += x[r * in + j] * FIX(w[j]);                            \
            sums[r] = s;                                                                                \
        }                                                                                               \
    }
static inline float fp8_scaled_down(uint8_t b) { return fp8_to_float(b) * (1.0f / 256.0f); }
ROW(fp8_row, uint8_t, load_fp8, fp8_scaled_down)
ROW(bf16_row, uint16_t, load_bf16, bf16_to_float)
#define FP8_UNIT (1.0f / 256.0f)  // what the vector conversion's values are of the weight's
#else
#define FP8_UNIT 1.0f
#define ROW(NAME, WTYPE, FIX)                                                                           \
    static void NAME(const float *x, int64_t in, const WTYPE *w, float *sums, const int ROWS) {         \
        for (int r = 0; r < ROWS; r++) {                                                                \
            float s = 0.0f;                                                                             \
            for (int64_t j = 0; j < in; j++) s += x[r * in + j] * FIX(w[j]);                            \
            sums[r] = s;                                                                                \
        }                                                                                               \
    }
ROW(fp8_row, uint8_t, fp8_to_float)
ROW(bf16_row, uint16_t, bf16_to_float)
#endif

// Output rows o0..o1 of y[rows, out] (rows <= MAX_ROWS), the row count made a constant for the compiler.
#define ROWS_OF(ROWFN, WTYPE)                                                                           \
    static void ROWFN##s(const float *x, int64_t rows, const WTYPE *w, int64_t in, int64_t o0, int64_t o1, \
                         float *y, int64_t out) {                                                       \
        float sums[MAX_ROWS];                                                                           \
        for (int64_t o = o0; o < o1; o++) {                                                             \
            const WTYPE *wo = w + o * in;                                                               \
            switch (rows) {                                                                             \
            case 1: ROWFN(x, in, wo, sums, 1); break;                                                   \
            case 2: ROWFN(x, in, wo, sums, 2); break;                                                   \
            case 3: ROWFN(x, in, wo, sums, 3); break;                                                   \
            case 4: ROWFN(x, in, wo, sums, 4); break;                                                   \
            case 5: ROWFN(x, in, wo, sums, 5); break;                                                   \
            case 6: ROWFN(x, in, wo, sums, 6); break;                                                   \
            case 7: ROWFN(x, in, wo, sums, 7); break;                                                   \
            default: ROWFN(x, in, wo, sums, 8); break;                                                  \
            }                                                                                           \
            for (int64_t r = 0; r < rows; r++) y[r * out + o] = sums[r];                                \
        }                                                                                               \
    }
ROWS_OF(fp8_row, uint8_t)
ROWS_OF(bf16_row, uint16_t)

// Output rows are split into contiguous ranges, one per thread: each thread streams its own weights.
// Threads come from OpenMP, the runtime torch's CPU build runs its own ops on (one pool, not two).
// Below this many weight bytes a product runs on one thread: waking others costs more than it saves.
#define MIN_PARALLEL_BYTES (256 * 1024)
static int team(int64_t weight_bytes, int threads) { return weight_bytes < MIN_PARALLEL_BYTES ? 1 : threads; }

static int64_t chunk_start(int64_t out, int thread, int threads) {
    int64_t per = (out + threads - 1) / threads;
    per = (per + 15) / 16 * 16;  // whole cache lines of y
    int64_t start = per * thread;
    return start < out ? start : out;
}

void drafter_fp8_gemv(const float *x, int64_t rows, int64_t in, const uint8_t *w, int64_t out,
                      const float *scale, int64_t per_channel, const float *bias, float *y, int threads) {
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        int64_t n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
        const float *xr = x + r0 * in;
        float *yr = y + r0 * out;
#pragma omp parallel num_threads(team(out * in, threads))
        {
#ifdef _OPENMP
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
            int t = 0, nt = 1;
#endif
            int64_t o0 = chunk_start(out, t, nt), o1 = chunk_start(out, t + 1, nt);
            fp8_rows(xr, n, w, in, o0, o1, yr, out);
            for (int64_t r = 0; r < n; r++)
                for (int64_t o = o0; o < o1; o++) {
                    float v = yr[r * out + o] * (scale[per_channel ? o : 0] / FP8_UNIT);
                    yr[r * out + o] = bias ? v + bias[o] : v;
                }
        }
    }
}

// The float32 weight itself, exactly torch's fp8 -> float32 x scale (w / 2^8 and scale x 2^8 are exact, so
// their product rounds as w x scale does): for a prefill chunk's matmul, many rows at once.
void drafter_fp8_dequantize(const uint8_t *w, int64_t out, int64_t in, const float *scale, int64_t per_channel,
                            float *dst, int threads) {
#pragma omp parallel for num_threads(team(out * in, threads)) schedule(static)
    for (int64_t o = 0; o < out; o++) {
        const float s = scale[per_channel ? o : 0] / FP8_UNIT;
        const uint8_t *row = w + o * in;
        float *to = dst + o * in;
        int64_t i = 0;
#ifdef LANES
        for (; i + LANES <= in; i += LANES) vstore(to + i, vmul(load_fp8(row + i), vset1(s)));
#endif
        for (; i < in; i++) to[i] = fp8_to_float(row[i]) * FP8_UNIT * s;
    }
}

void drafter_bf16_gemv(const float *x, int64_t rows, int64_t in, const uint16_t *w, int64_t out, float *y,
                       int threads) {
    for (int64_t r0 = 0; r0 < rows; r0 += MAX_ROWS) {
        int64_t n = rows - r0 < MAX_ROWS ? rows - r0 : MAX_ROWS;
#pragma omp parallel num_threads(team(out * in * 2, threads))
        {
#ifdef _OPENMP
            int t = omp_get_thread_num(), nt = omp_get_num_threads();
#else
            int t = 0, nt = 1;
#endif
            bf16_rows(x + r0 * in, n, w, in, chunk_start(out, t, nt), chunk_start(out, t + 1, nt),
                            y + r0 * out, out);
        }
    }
}
