/* 2x2 max pooling with stride 2 on NCHW planes of even height and width, as torch.max_pool2d_with_indices
 * computes it: out[p, i, j] = max of x[p, 2i:2i+2, 2j:2j+2] and idx[p, i, j] = the flat position h * W + w
 * of that maximum in its plane. Torch's rule for the position: the window is read row by row and a later
 * value replaces the current one only if it is greater, or NaN. The gradient is torch's own
 * max_pool2d_with_indices_backward over these indices (core/native.py), so results are bit for bit those
 * of torch.max_pool2d; this kernel only replaces its slow forward pass on CPU.
 *
 * Two passes, each a plain loop the compiler vectorizes:
 *   1. horizontal, over the whole tensor (W is even, so neighbours (2t, 2t+1) never straddle two rows):
 *      hm[t] = the larger of the pair (the first on ties), ha[t] = its flat position in x;
 *   2. vertical: the winner of the pair below replaces the one above only if greater (or NaN).
 * Reading the window as (pair of its top row, then pair of its bottom row) is torch's row-by-row order.
 */
#include <stdint.h>

/* x [P, H, W] contiguous, H and W even; hm, ha scratch of P * H * W / 2; out, idx [P, H/2, W/2] */
void maxpool2_fwd(const float* restrict x, int64_t P, int64_t H, int64_t W, float* restrict hm,
                  int64_t* restrict ha, float* restrict out, int64_t* restrict idx) {
    const int64_t H2 = H / 2, W2 = W / 2, n = P * H * W2;
    for (int64_t t = 0; t < n; t++) {
        const float a = x[2 * t], b = x[2 * t + 1];
        const int64_t s = (b > a) | (b != b);
        hm[t] = s ? b : a;
        ha[t] = 2 * t + s;
    }
    for (int64_t p = 0; p < P; p++) {
        const int64_t plane = p * H * W;
        for (int64_t i = 0; i < H2; i++) {
            const float* top = hm + (p * H + 2 * i) * W2;
            const float* bot = top + W2;
            const int64_t* ta = ha + (p * H + 2 * i) * W2;
            const int64_t* ba = ta + W2;
            float* o = out + (p * H2 + i) * W2;
            int64_t* k = idx + (p * H2 + i) * W2;
            for (int64_t j = 0; j < W2; j++) {
                const int s = (bot[j] > top[j]) | (bot[j] != bot[j]);
                o[j] = s ? bot[j] : top[j];
                k[j] = (s ? ba[j] : ta[j]) - plane;
            }
        }
    }
}
