// Fused multi-tensor Adam(W): one pass over params, grads and both moments, in place.
//
// * One launch steps up to 128 tensors: the host packs a table of pointers and sizes into the
//   kernel's parameters (no host-to-device copy); every tensor is cut into chunks of kChunk
//   elements, one block each, and a block finds its tensor by binary search in the table.
// * Vectorized memory access: a thread moves 4 elements per load/store (float4 for fp32, 8-byte
//   packs for bf16/fp16) when every pointer of the tensor is aligned and its size is a
//   multiple of 4; otherwise the tensor takes a scalar loop.
// * Types: params, exp_avg, exp_avg_sq are fp32 (the master copy and the states); grads are
//   fp32, bf16 or fp16; an optional 16-bit copy of the params (bf16 or fp16) is written in the
//   same pass, so a mixed-precision step moves 4 + 2 + 4 + 4 bytes in and 4 + 4 + 4 + 2 out.
// * Arithmetic: the moments as torch's CPU AdamW computes them (fmaf where it uses a fused
//   multiply-add), the denominator as DeepSpeed's CPU Adam does (fmaf(sqrtf(v), 1/sqrt(bc2), eps):
//   one division, not two), IEEE sqrtf and division (no --use_fast_math): the same operations as
//   the Numba kernels, so CPU and GPU agree bit for bit on the same inputs.
// Only the headers it needs: ATen/cuda/CUDAContext.h would pull in cuBLAS and cuSPARSE headers,
// which a minimal CUDA toolkit does not ship.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <vector>

namespace {

constexpr int kMaxTensors = 128;  // tensors per launch: the table below is 6.7 KB of kernel parameters
constexpr int kChunk = 8192;      // elements per block (a multiple of 4)
constexpr int kThreads = 256;     // each thread moves 4 elements per iteration: 8 iterations per chunk

struct AdamConsts {
  float decay, l2, w1, b2, w2, inv_bc2_sqrt, eps, neg_step_size;
};

// Tensor t owns blocks first_block[t] .. first_block[t + 1] - 1, one chunk of kChunk elements each.
struct TensorTable {
  void* ptr[5][kMaxTensors];  // param (fp32), grad, exp_avg, exp_avg_sq, param16 (or null)
  int64_t numel[kMaxTensors];
  int first_block[kMaxTensors + 1];
  int tensors;
};
// CUDA 12.1+ allows 32764 bytes of kernel parameters on every architecture CUDA 13 supports.
static_assert(sizeof(TensorTable) + sizeof(AdamConsts) <= 32764, "kernel parameters too large");

// The element update, shared by the vector and the scalar loop.
__device__ __forceinline__ void adam_update(float& p, float g, float& m, float& v, const AdamConsts& k) {
  if (k.l2 != 0.f) g = fmaf(k.l2, p, g);           // Adam: L2 penalty in the gradient
  p = __fmul_rn(p, k.decay);  // AdamW: param.mul_(1 - lr * wd), rounded apart (a plain * nvcc fuses with the last add)
  const float d = g - m;                           // exp_avg.lerp_(grad, w1)
  m = k.w1 < 0.5f ? fmaf(k.w1, d, m) : fmaf(k.w1 - 1.f, d, g);
  v = fmaf(k.w2 * g, g, k.b2 * v);                 // exp_avg_sq.mul_(b2).addcmul_(g, g, value=w2)
  const float denom = fmaf(sqrtf(v), k.inv_bc2_sqrt, k.eps);  // DeepSpeed's denominator
  p = p + (k.neg_step_size * m) / denom;           // param.addcdiv_(exp_avg, denom, value=-step_size)
}

// Four consecutive elements of type T, loaded or stored with one instruction.
template <typename T>
struct alignas(4 * sizeof(T)) Pack4 {
  T x[4];
};

template <typename T>
__device__ __forceinline__ void load4(const T* ptr, float out[4]) {
  const Pack4<T> pk = *reinterpret_cast<const Pack4<T>*>(ptr);
#pragma unroll
  for (int j = 0; j < 4; ++j) out[j] = static_cast<float>(pk.x[j]);
}

template <typename T>
__device__ __forceinline__ void store4(T* ptr, const float in[4]) {
  Pack4<T> pk;
#pragma unroll
  for (int j = 0; j < 4; ++j) pk.x[j] = static_cast<T>(in[j]);
  *reinterpret_cast<Pack4<T>*>(ptr) = pk;
}

template <typename T>
__device__ __forceinline__ bool aligned4(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % (4 * sizeof(T)) == 0;
}

// G: the gradient type; P16: the 16-bit parameter copy (ignored when kCopy is false).
template <typename G, typename P16, bool kCopy>
__global__ void __launch_bounds__(kThreads) multi_tensor_adam_kernel(TensorTable table, AdamConsts k) {
  const int b = blockIdx.x;
  int lo = 0, hi = table.tensors - 1;  // the tensor t with first_block[t] <= b < first_block[t + 1]
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table.first_block[mid] <= b) lo = mid; else hi = mid - 1;
  }
  const int t = lo;
  const int64_t n = table.numel[t];
  const int64_t start = static_cast<int64_t>(b - table.first_block[t]) * kChunk;
  const int64_t end = min(n, start + kChunk);
  float* __restrict__ p = static_cast<float*>(table.ptr[0][t]);
  const G* __restrict__ g = static_cast<const G*>(table.ptr[1][t]);
  float* __restrict__ m = static_cast<float*>(table.ptr[2][t]);
  float* __restrict__ v = static_cast<float*>(table.ptr[3][t]);
  P16* __restrict__ p16 = static_cast<P16*>(table.ptr[4][t]);

  const bool vec = n % 4 == 0 && aligned4<float>(p) && aligned4<G>(g) && aligned4<float>(m) &&
                   aligned4<float>(v) && (!kCopy || aligned4<P16>(p16));
  if (vec) {
    for (int64_t i = start + 4 * static_cast<int64_t>(threadIdx.x); i < end; i += 4 * kThreads) {
      float pr[4], gr[4], mr[4], vr[4];
      load4(p + i, pr);
      load4(g + i, gr);
      load4(m + i, mr);
      load4(v + i, vr);
#pragma unroll
      for (int j = 0; j < 4; ++j) adam_update(pr[j], gr[j], mr[j], vr[j], k);
      store4(p + i, pr);
      store4(m + i, mr);
      store4(v + i, vr);
      if constexpr (kCopy) store4(p16 + i, pr);
    }
  } else {
    for (int64_t i = start + threadIdx.x; i < end; i += kThreads) {
      float pi = p[i], mi = m[i], vi = v[i];
      adam_update(pi, static_cast<float>(g[i]), mi, vi, k);
      p[i] = pi;
      m[i] = mi;
      v[i] = vi;
      if constexpr (kCopy) p16[i] = static_cast<P16>(pi);
    }
  }
}

template <typename G, typename P16, bool kCopy>
void launch_all(const std::vector<std::vector<at::Tensor>>& lists, const AdamConsts& k) {
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  TensorTable table{};
  auto launch = [&]() {
    const int blocks = table.first_block[table.tensors];
    multi_tensor_adam_kernel<G, P16, kCopy><<<blocks, kThreads, 0, stream>>>(table, k);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    table.tensors = 0;
  };
  for (size_t i = 0; i < lists[0].size(); ++i) {
    const int64_t n = lists[0][i].numel();
    if (n == 0) continue;
    TORCH_CHECK((n + kChunk - 1) / kChunk < (1LL << 30), "tensor too large for one launch");
    const int t = table.tensors;
    for (int d = 0; d < 5; ++d) table.ptr[d][t] = (d < 4 || kCopy) ? lists[d][i].data_ptr() : nullptr;
    table.numel[t] = n;
    table.first_block[t + 1] = table.first_block[t] + static_cast<int>((n + kChunk - 1) / kChunk);
    table.tensors = t + 1;
    if (table.tensors == kMaxTensors || table.first_block[table.tensors] > (1 << 30)) launch();
  }
  if (table.tensors > 0) launch();
}

}  // namespace

// lists: params, grads, exp_avgs, exp_avg_sqs, params16 (may be empty); checked in Python and here.
void fused_adam_cuda(const std::vector<std::vector<at::Tensor>>& lists, double decay, double l2, double w1,
                     double b2, double w2, double inv_bc2_sqrt, double eps, double neg_step_size) {
  TORCH_CHECK(lists.size() == 5, "expected 5 tensor lists");
  const size_t count = lists[0].size();
  TORCH_CHECK(count > 0, "no tensors to step");
  const bool copy = !lists[4].empty();
  for (int d = 0; d < 5; ++d) {
    if (d == 4 && !copy) continue;
    TORCH_CHECK(lists[d].size() == count, "tensor lists differ in length");
    for (const auto& x : lists[d]) {
      TORCH_CHECK(x.is_cuda() && x.is_contiguous(), "tensors must be contiguous CUDA tensors");
      TORCH_CHECK(x.device() == lists[0][0].device(), "tensors must be on one device");
    }
  }
  for (size_t t = 0; t < count; ++t) {
    TORCH_CHECK(lists[0][t].scalar_type() == at::kFloat && lists[2][t].scalar_type() == at::kFloat &&
                    lists[3][t].scalar_type() == at::kFloat,
                "params, exp_avgs and exp_avg_sqs must be fp32");
    for (int d = 1; d < (copy ? 5 : 4); ++d)
      TORCH_CHECK(lists[d][t].numel() == lists[0][t].numel(), "tensor sizes differ");
  }
  const c10::cuda::CUDAGuard guard(lists[0][0].device());
  const AdamConsts k{static_cast<float>(decay), static_cast<float>(l2), static_cast<float>(w1),
                     static_cast<float>(b2), static_cast<float>(w2), static_cast<float>(inv_bc2_sqrt),
                     static_cast<float>(eps), static_cast<float>(neg_step_size)};
  const auto g = lists[1][0].scalar_type();
  const auto h = copy ? lists[4][0].scalar_type() : at::kFloat;
  for (size_t t = 0; t < count; ++t) {
    TORCH_CHECK(lists[1][t].scalar_type() == g, "all grads must have one dtype");
    if (copy) TORCH_CHECK(lists[4][t].scalar_type() == h, "all params16 must have one dtype");
  }
  using at::BFloat16;
  using at::Half;
  if (!copy && g == at::kFloat) return launch_all<float, float, false>(lists, k);
  if (copy && h == at::kBFloat16 && g == at::kFloat) return launch_all<float, BFloat16, true>(lists, k);
  if (copy && h == at::kBFloat16 && g == at::kBFloat16) return launch_all<BFloat16, BFloat16, true>(lists, k);
  if (copy && h == at::kHalf && g == at::kFloat) return launch_all<float, Half, true>(lists, k);
  if (copy && h == at::kHalf && g == at::kHalf) return launch_all<Half, Half, true>(lists, k);
  TORCH_CHECK(false, "unsupported dtypes: grads ", g, ", params16 ", copy ? c10::toString(h) : "none",
              " (grads are fp32 or the params16 dtype; params16 is bf16 or fp16)");
}
