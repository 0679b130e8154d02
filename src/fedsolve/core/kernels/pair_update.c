/* FPFC's server update of the pairs touching the active devices, on the dense antisymmetric store.
 *
 * The store (families/clustered/fpfc/pairs.py, DensePairs) keeps, per ordered pair, delta_ij (d floats; delta_ji =
 * -delta_ij) and s_ij (theta_ij = s_ij delta_ij, v_ij / rho = (1 - s_ij) delta_ij), and per device the
 * row sum R_i = sum_j (2 s_ij - 1) delta_ij. One round, for the active devices ids[0..k-1]:
 *
 *   pair_delta  (pass 1)  D_ij = w_i - w_j + (1 - s_ij) delta_ij  for every i in ids and every j, its
 *                         squared norm, and per thread col[j] += (2 s_ij - 1) delta_ij (the old terms)
 *   [Python]              s'_ij = prox_scale(||D_ij||)            (eq. 6, the paper's four branches)
 *   pair_write  (pass 2)  delta_ij = D_ij, s_ij = s'_ij, and for inactive j also delta_ji = -D_ij,
 *                         s_ji = s'_ij; row[i] = sum_j (2 s'_ij - 1) D_ij; per thread
 *                         col[j] += (2 s'_ij - 1) D_ij (the new terms)
 *
 * The caller then sets R_i = row[i] for the active devices and R_j -= col_new[j] - col_old[j] for the
 * others. Each pass reads or writes every touched pair once, where the tensor version makes about twenty
 * passes over the [k, m, d] block. A call handles the positions p0..p1-1 of ids, so threads split the
 * active devices; a pair (i, j) and its mirror (j, i) are written by the thread that owns i only
 * (active j write their own rows), so threads never write the same memory.
 */
#include <stdint.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
static inline v8 bc(float x) { return (v8){x, x, x, x, x, x, x, x}; }
static inline v8 load(const float* p) { v8 v; memcpy(&v, p, sizeof v); return v; }
static inline void store(float* p, v8 v) { memcpy(p, &v, sizeof v); }

/* D_ij = (w_i - w_j) + (1 - s) delta_ij is computed the same way for (i, j) and (j, i), so the two are exact
 * negatives of each other (IEEE rounding is symmetric) and the store stays exactly antisymmetric. */
void pair_delta(const float* restrict delta, const float* restrict scale, const float* restrict W, int64_t m,
                int64_t d, const int64_t* ids, int64_t p0, int64_t p1, float* restrict Dn, float* restrict r2,
                float* restrict col) {
    for (int64_t p = p0; p < p1; p++) {
        const int64_t i = ids[p];
        const float* wi = W + i * d;
        for (int64_t j = 0; j < m; j++) {
            const float s = scale[i * m + j], keep = 1.0f - s, c = 2.0f * s - 1.0f;
            const float* old = delta + (i * m + j) * d;
            const float* wj = W + j * d;
            float* out = Dn + (p * m + j) * d;
            float* cj = col + j * d;
            v8 acc = bc(0.0f);
            int64_t t = 0;
            for (; t + 8 <= d; t += 8) {
                const v8 o = load(old + t), v = (load(wi + t) - load(wj + t)) + bc(keep) * o;
                store(out + t, v);
                acc += v * v;
                store(cj + t, load(cj + t) + bc(c) * o);
            }
            float sq = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (; t < d; t++) {
                const float v = (wi[t] - wj[t]) + keep * old[t];
                out[t] = v;
                sq += v * v;
                cj[t] += c * old[t];
            }
            r2[p * m + j] = sq;
        }
    }
}

void pair_write(float* restrict delta, float* restrict scale, const float* restrict Dn, const float* restrict S,
                int64_t m, int64_t d, const int64_t* ids, const uint8_t* active, int64_t p0, int64_t p1,
                float* restrict row, float* restrict col) {
    for (int64_t p = p0; p < p1; p++) {
        const int64_t i = ids[p];
        float* ri = row + p * d;
        for (int64_t t = 0; t < d; t++) ri[t] = 0.0f;
        for (int64_t j = 0; j < m; j++) {
            const float s = S[p * m + j], c = 2.0f * s - 1.0f;
            const float* v = Dn + (p * m + j) * d;
            float* dij = delta + (i * m + j) * d;
            float* cj = col + j * d;
            for (int64_t t = 0; t < d; t++) {
                dij[t] = v[t];
                ri[t] += c * v[t];
                cj[t] += c * v[t];
            }
            scale[i * m + j] = s;
            if (!active[j]) {
                float* dji = delta + (j * m + i) * d;
                for (int64_t t = 0; t < d; t++) dji[t] = -v[t];
                scale[j * m + i] = s;
            }
        }
    }
}
