// Paged MLA decode / verify attention (absorbed form) for sm_120 (RTX PRO 6000, RTX 50xx) and
// sm_90 (H100, H200). The algorithm of the CPU twin (kernels/cpu/paged_mla_decode.cpp):
//  * flash-decoding: grid (splits, batch, row groups); each thread block takes one split of one
//    request's KV sequence, so a single long request fills every SM; a second kernel merges the
//    splits' partial softmax states;
//  * one latent cell is loaded once per block and used by every head (and every query token of a
//    verify step): the cells of a tile are copied into shared memory with 16-byte asynchronous
//    copies (cp.async), double-buffered so the next tile's loads overlap this tile's arithmetic;
//  * page_size 1 through the page table: each cell's address comes from the table, so a
//    scattered pool costs no more than a contiguous one once the copies are in flight;
//  * online softmax per tile in fp32; fp32 and bf16 caches.
//
// Shapes (one layer), as in kernels/reference/paged_mla_decode.py:
//   q [batch, n_q, heads, dim]; kv_pool [slots, dim]; page_table [batch, max_pages] int64;
//   seq_lens [batch] int64 (the n_q new cells included); out [batch, n_q, heads, kv_lora_rank].
// Query j sees cells 0 .. seq_len - n_q + j. dim and kv_lora_rank are multiples of 16.
//
// This file has no PyTorch in it: nvcc compiles it alone into a cubin (with ptxas' resource report)
// for each architecture; paged_mla_decode_binding.cpp adds the PyTorch entry point where PyTorch
// has CUDA.

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>
#include <stdint.h>

namespace {

constexpr int THREADS = 256;       // 8 warps per block
constexpr int WARPS = THREADS / 32;
constexpr int ROWS = 16;           // (query, head) rows per block; more rows take more blocks (grid.z)
constexpr int MAX_DPT = 4;         // output dims per thread: kv_lora_rank <= 1024

template <typename T> struct Tile;  // KV tokens per tile, sized so two tiles + q fit shared memory
template <> struct Tile<__nv_bfloat16> { static constexpr int n = 32; };
template <> struct Tile<float> { static constexpr int n = 8; };

__device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ void from_f(float x, float* p) { *p = x; }
__device__ __forceinline__ void from_f(float x, __nv_bfloat16* p) { *p = __float2bfloat16(x); }

struct Params {
  const void* q;
  const void* pool;
  const int64_t* table;
  const int64_t* lens;
  void* out;
  float* ws;  // [batch, splits, rows, lat + 2]: partial acc, then m and l
  int64_t n_q, heads, dim, lat, max_pages, page_size, slots;
  int splits;
  float scale;
};

template <typename T>
__device__ __forceinline__ void load_tile(const Params& p, const T* pool, const int64_t* pages, int64_t a,
                                          int64_t t1, T* dst) {
  constexpr int TILE = Tile<T>::n;
  const int chunks = static_cast<int>(p.dim * sizeof(T) / 16);  // 16-byte pieces per cell
  for (int idx = threadIdx.x; idx < TILE * chunks; idx += THREADS) {
    const int i = idx / chunks, c = idx % chunks;
    const int64_t t = a + i;
    if (t < t1) {
      const int64_t slot = pages[t / p.page_size] * p.page_size + t % p.page_size;
      __pipeline_memcpy_async(reinterpret_cast<char*>(dst + i * p.dim) + 16 * c,
                              reinterpret_cast<const char*>(pool + slot * p.dim) + 16 * c, 16);
    }
  }
  __pipeline_commit();
}

template <typename T>
__global__ void __launch_bounds__(THREADS) paged_mla_split_kernel(Params p) {
  constexpr int TILE = Tile<T>::n;
  extern __shared__ __align__(16) unsigned char smem[];
  const int b = blockIdx.y, split = blockIdx.x;
  const int64_t rows_total = p.n_q * p.heads;
  const int64_t r0 = static_cast<int64_t>(blockIdx.z) * ROWS;
  const int rows = static_cast<int>(imin(ROWS, rows_total - r0));
  const int64_t n = p.lens[b];
  const int64_t per = (n + p.splits - 1) / p.splits;
  const int64_t t0 = imin(n, split * per), t1 = imin(n, t0 + per);
  const T* pool = static_cast<const T*>(p.pool);
  const int64_t* pages = p.table + b * p.max_pages;

  T* qs = reinterpret_cast<T*>(smem);                   // [ROWS, dim]
  T* kv = qs + ROWS * p.dim;                            // [2, TILE, dim]
  float* sc = reinterpret_cast<float*>(kv + 2 * TILE * p.dim);  // [ROWS, TILE] scores, then probabilities
  float* m_s = sc + ROWS * TILE;                        // [ROWS]
  float* alpha_s = m_s + ROWS;                          // [ROWS]
  float* l_s = alpha_s + ROWS;                          // [ROWS]

  const T* qb = static_cast<const T*>(p.q) + (static_cast<int64_t>(b) * rows_total + r0) * p.dim;
  for (int64_t i = threadIdx.x; i < rows * p.dim; i += THREADS) qs[i] = qb[i];
  if (threadIdx.x < ROWS) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.f;
  }
  __syncthreads();
  float acc[ROWS][MAX_DPT];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int k = 0; k < MAX_DPT; ++k) acc[r][k] = 0.f;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (t0 < t1) load_tile(p, pool, pages, t0, t1, kv);
  int stage = 0;
  for (int64_t a = t0; a < t1; a += TILE, stage ^= 1) {
    if (a + TILE < t1) {
      load_tile(p, pool, pages, a + TILE, t1, kv + (stage ^ 1) * TILE * p.dim);
      __pipeline_wait_prior(1);
    } else {
      __pipeline_wait_prior(0);
    }
    __syncthreads();
    const T* tile = kv + stage * TILE * p.dim;
    const int nt = static_cast<int>(imin(TILE, t1 - a));
    // scores: one warp per (row, token) pair, lanes across dim
    for (int pair = warp; pair < rows * TILE; pair += WARPS) {
      const int r = pair / TILE, i = pair % TILE;
      float s = 0.f;
      if (i < nt) {
        const T* qr = qs + r * p.dim;
        const T* cell = tile + i * p.dim;
        for (int64_t d = lane; d < p.dim; d += 32) s += to_f(qr[d]) * to_f(cell[d]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) {
        const int64_t j = (r0 + r) / p.heads;  // the row's query token
        const bool visible = i < nt && a + i < n - p.n_q + j + 1;
        sc[r * TILE + i] = visible ? s * p.scale : -INFINITY;
      }
    }
    __syncthreads();
    // online softmax: one warp per row, one lane per token of the tile
    for (int r = warp; r < rows; r += WARPS) {
      const float s = lane < TILE ? sc[r * TILE + lane] : -INFINITY;
      float mx = s;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_old = m_s[r];
      const float m_new = fmaxf(m_old, mx);
      const float pr = m_new == -INFINITY ? 0.f : __expf(s - m_new);
      float sum = pr;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      if (lane < TILE) sc[r * TILE + lane] = pr;
      if (lane == 0) {
        const float alpha = (m_old == -INFINITY || m_new == -INFINITY) ? 0.f : __expf(m_old - m_new);
        alpha_s[r] = alpha;
        l_s[r] = l_s[r] * alpha + sum;
        m_s[r] = m_new;
      }
    }
    __syncthreads();
    // values: each thread owns output dims threadIdx.x + k * THREADS of every row
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (r < rows) {  // guards, not breaks: the loops unroll and acc stays in registers
        const float alpha = alpha_s[r];
#pragma unroll
        for (int k = 0; k < MAX_DPT; ++k) {
          const int64_t d = threadIdx.x + k * THREADS;
          if (d < p.lat) {
            float o = acc[r][k] * alpha;
            for (int i = 0; i < nt; ++i) o += sc[r * TILE + i] * to_f(tile[i * p.dim + d]);
            acc[r][k] = o;
          }
        }
      }
    }
    __syncthreads();  // the tile and the scores are reused by the next iteration
  }
  // partial state of this (request, split) for the rows of this block
  const int64_t base = (static_cast<int64_t>(b) * p.splits + split) * rows_total;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    if (r < rows) {
      float* w = p.ws + (base + r0 + r) * (p.lat + 2);
#pragma unroll
      for (int k = 0; k < MAX_DPT; ++k) {
        const int64_t d = threadIdx.x + k * THREADS;
        if (d < p.lat) w[d] = acc[r][k];
      }
      if (threadIdx.x == 0) {
        w[p.lat] = m_s[r];
        w[p.lat + 1] = l_s[r];
      }
    }
  }
}

// out[b, row] = sum_k e^(m_k - M) acc_k / sum_k e^(m_k - M) l_k over the splits k
template <typename T>
__global__ void __launch_bounds__(THREADS) paged_mla_merge_kernel(Params p) {
  const int64_t rows_total = p.n_q * p.heads;
  const int64_t b = blockIdx.y, r = blockIdx.x;
  float mx = -INFINITY;
  for (int k = 0; k < p.splits; ++k) mx = fmaxf(mx, p.ws[((b * p.splits + k) * rows_total + r) * (p.lat + 2) + p.lat]);
  float denom = 0.f;
  for (int k = 0; k < p.splits; ++k) {
    const float* w = p.ws + ((b * p.splits + k) * rows_total + r) * (p.lat + 2);
    if (w[p.lat] != -INFINITY) denom += __expf(w[p.lat] - mx) * w[p.lat + 1];
  }
  T* out = static_cast<T*>(p.out) + (b * rows_total + r) * p.lat;
  for (int64_t d = threadIdx.x; d < p.lat; d += THREADS) {
    float o = 0.f;
    for (int k = 0; k < p.splits; ++k) {
      const float* w = p.ws + ((b * p.splits + k) * rows_total + r) * (p.lat + 2);
      if (w[p.lat] != -INFINITY) o += __expf(w[p.lat] - mx) * w[d];
    }
    from_f(o / denom, out + d);
  }
}

template <typename T>
size_t smem_bytes(int64_t dim) {
  return ROWS * dim * sizeof(T) + 2 * Tile<T>::n * dim * sizeof(T) + (ROWS * Tile<T>::n + 3 * ROWS) * sizeof(float);
}

template <typename T>
cudaError_t launch(const Params& p, int64_t batch, cudaStream_t stream) {
  const size_t smem = smem_bytes<T>(p.dim);
  cudaError_t err = cudaFuncSetAttribute(paged_mla_split_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
  if (err != cudaSuccess) return err;
  const int64_t rows_total = p.n_q * p.heads;
  dim3 grid(p.splits, static_cast<unsigned>(batch), static_cast<unsigned>((rows_total + ROWS - 1) / ROWS));
  paged_mla_split_kernel<T><<<grid, THREADS, smem, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  paged_mla_merge_kernel<T><<<dim3(static_cast<unsigned>(rows_total), static_cast<unsigned>(batch)), THREADS, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

extern "C" {

// Shared memory the split kernel needs for a cell of `dim` values (dtype 0: fp32, 1: bf16).
size_t longctx_paged_mla_smem_bytes(int dtype, int64_t dim) {
  return dtype == 1 ? smem_bytes<__nv_bfloat16>(dim) : smem_bytes<float>(dim);
}

// Floats of workspace the launch needs.
int64_t longctx_paged_mla_workspace_floats(int64_t batch, int64_t splits, int64_t rows, int64_t lat) {
  return batch * splits * rows * (lat + 2);
}

// 0 on success, else a cudaError_t. dtype 0: fp32, 1: bf16. Every pointer is device memory.
int longctx_paged_mla_attention(int dtype, const void* q, const void* pool, const int64_t* table, const int64_t* lens,
                                void* out, float* ws, int64_t batch, int64_t n_q, int64_t heads, int64_t dim,
                                int64_t lat, int64_t max_pages, int64_t page_size, int64_t slots, int splits,
                                float scale, cudaStream_t stream) {
  if (dim % 16 != 0 || lat % 16 != 0 || lat > THREADS * MAX_DPT || splits < 1) return cudaErrorInvalidValue;
  Params p{q, pool, table, lens, out, ws, n_q, heads, dim, lat, max_pages, page_size, slots, splits, scale};
  return static_cast<int>(dtype == 1 ? launch<__nv_bfloat16>(p, batch, stream) : launch<float>(p, batch, stream));
}

}  // extern "C"
