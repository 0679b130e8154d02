/* Full-batch gradient descent on multinomial logistic regression, one device at a time.
 *
 * The hot loop of the `linear` executor (core/linear.py) for cross-entropy models, compiled at first
 * use by core/native.py. For each listed device d with rows [xoff[d], xoff[d] + np[d]) (n[d] of them
 * real, the rest zero padding with label -1), steps[d] times:
 *
 *     A <- A - lr * ( grad f_d(A) + wd * A + rho * (A - Z) )        f_d = mean cross-entropy of softmax(A x)
 *
 * A and Z are [NC][F] (F = inputs + 1, the bias folded in as a constant-1 feature; Z may be NULL).
 * With G != NULL it instead writes grad f_d(A) into G and f_d(A) into loss (no step).
 * loss_out[d] is the mean over the steps of f_d at each step's starting point (the torch path's rule).
 *
 * Layout: samples lie in the lanes of 8-wide vectors. The rows of a device are cut into blocks of
 * 16; block b is stored feature-major, X[(row0 + 16 b) * F + f * 16 + lane], so one block's reads are
 * one contiguous 16 F-float stretch. Forward: 8 rows x NC classes of logits stay in registers while
 * the F features stream by. Backward: the gradient is kept as NC x F partial sums per lane and summed
 * across lanes once per step. Only GCC/Clang vector extensions are used (no intrinsics), so the same
 * source builds on any target; -march=native picks the widest instructions the machine has.
 * Results are deterministic (fixed summation order); they agree with the torch path to float
 * rounding (tests/test_native_kernel.py). exp and log are polynomials accurate to about 1e-7.
 */
#include <stdint.h>
#include <string.h>

#ifndef NC
#error "compile with -DNC=<number of classes>"
#endif

typedef float v8 __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
#define LANES 8
#define BLOCK 16

static inline v8 bc(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8i bci(int32_t x) { return (v8i){x, x, x, x, x, x, x, x}; }
static inline v8 sel(v8i m, v8 a, v8 b) { return (v8)(((v8i)a & m) | ((v8i)b & ~m)); }
static inline v8 load(const float* p) { v8 v; memcpy(&v, p, sizeof v); return v; }

/* e^x for x <= 0: x = n ln2 + r with |r| <= ln2/2, degree-6 Taylor polynomial of e^r, times 2^n. */
static inline v8 vexp(v8 x) {
    x = sel(x < bc(-87.0f), bc(-87.0f), x);
    v8i n = __builtin_convertvector(x * bc(1.44269504088896341f) - bc(0.5f), v8i);  /* round, x <= 0 */
    v8 nf = __builtin_convertvector(n, v8);
    v8 r = x - nf * bc(0.693145751953125f) - nf * bc(1.428606765330187e-06f);
    v8 p = bc(1.0f / 720);
    p = p * r + bc(1.0f / 120); p = p * r + bc(1.0f / 24); p = p * r + bc(1.0f / 6);
    p = p * r + bc(0.5f); p = p * r + bc(1.0f); p = p * r + bc(1.0f);
    return p * (v8)((n + bci(127)) << 23);
}

/* log x for x >= 1: exponent e and mantissa m in [1, 2); log m = 2 atanh((m-1)/(m+1)), series to u^11. */
static inline v8 vlog(v8 x) {
    v8i b = (v8i)x;
    v8 e = __builtin_convertvector((b >> 23) - bci(127), v8);
    v8 m = (v8)((b & bci(0x007fffff)) | bci(0x3f800000));
    v8 u = (m - bc(1.0f)) / (m + bc(1.0f)), u2 = u * u;
    v8 q = bc(1.0f / 11);
    q = q * u2 + bc(1.0f / 9); q = q * u2 + bc(1.0f / 7); q = q * u2 + bc(1.0f / 5); q = q * u2 + bc(1.0f / 3);
    q = q * u2 + bc(1.0f);
    return bc(2.0f) * u * q + e * bc(0.69314718055994531f);
}

/* Sum of the cross-entropy over the device's rows; its gradient (a sum, not a mean) into G [NC][F].
 * acc: NC * F vectors of scratch. */
static double loss_grad(const float* restrict X, const int32_t* restrict y, int64_t np, int F,
                        const float* restrict A, float* restrict G, v8* restrict acc) {
    memset(acc, 0, sizeof(v8) * NC * F);
    v8 lsum = bc(0.f);
    for (int64_t i = 0; i < np; i += BLOCK) {
        const float* xb = X + i * F;                 /* this block: [F][BLOCK] */
        v8 g[2][NC];
        for (int h = 0; h < 2; h++) {                /* two halves of 8 rows: logits, softmax, residuals */
            v8 z[NC];
            for (int c = 0; c < NC; c++) z[c] = bc(0.f);
            for (int f = 0; f < F; f++) {
                v8 xf = load(xb + f * BLOCK + h * LANES);
                for (int c = 0; c < NC; c++) z[c] += xf * bc(A[c * F + f]);
            }
            v8i yv; memcpy(&yv, y + i + h * LANES, sizeof yv);
            v8 mx = z[0];
            for (int c = 1; c < NC; c++) mx = sel(z[c] > mx, z[c], mx);
            v8 s = bc(0.f), zy = bc(0.f);
            for (int c = 0; c < NC; c++) {
                g[h][c] = vexp(z[c] - mx);
                s += g[h][c];
                zy = sel(yv == bci(c), z[c], zy);
            }
            v8 inv = bc(1.0f) / s;
            v8 valid = (v8)((yv >= bci(0)) & (v8i)bc(1.0f));      /* 0 on padding rows */
            for (int c = 0; c < NC; c++)
                g[h][c] = (g[h][c] * inv - (v8)((yv == bci(c)) & (v8i)bc(1.0f))) * valid;
            lsum += (vlog(s) + mx - zy) * valid;
        }
        int c = 0;
        for (; c + 2 <= NC; c += 2) {                /* acc[c][f] += sum over the block's rows of g_c x_f */
            v8 g00 = g[0][c], g01 = g[1][c], g10 = g[0][c + 1], g11 = g[1][c + 1];
            v8* a0 = acc + (int64_t)c * F;
            v8* a1 = a0 + F;
            for (int f = 0; f < F; f++) {
                v8 x0 = load(xb + f * BLOCK), x1 = load(xb + f * BLOCK + LANES);
                v8 s0 = a0[f], s1 = a1[f];
                s0 += g00 * x0; s1 += g10 * x0;
                s0 += g01 * x1; s1 += g11 * x1;
                a0[f] = s0; a1[f] = s1;
            }
        }
        for (; c < NC; c++) {
            v8 g0 = g[0][c], g1 = g[1][c];
            v8* a = acc + (int64_t)c * F;
            for (int f = 0; f < F; f++) {
                v8 s0 = a[f];
                s0 += g0 * load(xb + f * BLOCK);
                s0 += g1 * load(xb + f * BLOCK + LANES);
                a[f] = s0;
            }
        }
    }
    for (int k = 0; k < NC * F; k++) {
        v8 v = acc[k];
        G[k] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
    double l = 0.0;
    for (int k = 0; k < LANES; k++) l += lsum[k];
    return l;
}

/* work: scratch of at least NC * F * (LANES + 1) floats, 32-byte aligned. */
void softmax_gd(const float* X, const int32_t* y, int F, int ndev, const int64_t* xoff, const int64_t* np,
                const int64_t* n, const int32_t* steps, float* A, const float* Z, float lr, float rho, float wd,
                double* loss_out, float* G, float* work) {
    v8* acc = (v8*)work;
    float* gbuf = work + (int64_t)NC * F * LANES;
    const int64_t P = (int64_t)NC * F;
    for (int d = 0; d < ndev; d++) {
        float* a = A + d * P;
        const float* z = Z ? Z + d * P : 0;
        const float* x = X + xoff[d] * F;
        const int32_t* yy = y + xoff[d];
        const float inv_n = 1.0f / (float)n[d];
        if (G) {
            float* g = G + d * P;
            loss_out[d] = loss_grad(x, yy, np[d], F, a, g, acc) / (double)n[d];
            for (int64_t k = 0; k < P; k++) g[k] *= inv_n;
            continue;
        }
        double lsum = 0.0;
        const int T = steps[d];
        for (int s = 0; s < T; s++) {
            lsum += loss_grad(x, yy, np[d], F, a, gbuf, acc) / (double)n[d];
            for (int64_t k = 0; k < P; k++) {
                float gk = gbuf[k] * inv_n;
                if (wd != 0.0f) gk += wd * a[k];
                if (z) gk += rho * (a[k] - z[k]);
                a[k] -= lr * gk;
            }
        }
        loss_out[d] = T > 0 ? lsum / T : 0.0;
    }
}
