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
//  * online softmax per tile in fp32; fp32 and bf16 caches;
//  * a page id outside the KV pool is never read through: the cell is skipped, the request's rows
//    are written as NaN and its flag set; the host call reads the flags back (not while a CUDA graph
//    is being captured: there the NaN rows are the only sign) and fails as the CPU twin does.
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
  int* bad;   // [batch, splits]: 1 where the split met a page id outside the pool
  int* bad_request;  // [batch]: 1 where any split of the request did
  int64_t n_q, heads, dim, lat, max_pages, page_size, slots;
  int splits;
  float scale;
};

// Starts the copies of cells [a, min(a + TILE, t1)) into dst; false where a page id of one of them
// points outside the pool (that cell is not read).
template <typename T>
__device__ __forceinline__ bool load_tile(const Params& p, const T* pool, const int64_t* pages, int64_t a,
                                          int64_t t1, T* dst) {
  constexpr int TILE = Tile<T>::n;
  const int chunks = static_cast<int>(p.dim * sizeof(T) / 16);  // 16-byte pieces per cell
  bool ok = true;
  for (int idx = threadIdx.x; idx < TILE * chunks; idx += THREADS) {
    const int i = idx / chunks, c = idx % chunks;
    const int64_t t = a + i;
    if (t < t1) {
      const int64_t slot = pages[t / p.page_size] * p.page_size + t % p.page_size;
      if (slot < 0 || slot >= p.slots) {
        ok = false;
        continue;
      }
      __pipeline_memcpy_async(reinterpret_cast<char*>(dst + i * p.dim) + 16 * c,
                              reinterpret_cast<const char*>(pool + slot * p.dim) + 16 * c, 16);
    }
  }
  __pipeline_commit();
  return ok;
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
  bool in_pool = true;  // every cell this thread copied lies in the pool
  if (t0 < t1) in_pool &= load_tile(p, pool, pages, t0, t1, kv);
  int stage = 0;
  for (int64_t a = t0; a < t1; a += TILE, stage ^= 1) {
    if (a + TILE < t1) {
      in_pool &= load_tile(p, pool, pages, a + TILE, t1, kv + (stage ^ 1) * TILE * p.dim);
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
  // every block of this (request, split) sees the same cells, so they all write the same flag
  const int bad = __syncthreads_or(!in_pool);
  if (threadIdx.x == 0) p.bad[static_cast<int64_t>(b) * p.splits + split] = bad;
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
  int bad = 0;
  for (int k = 0; k < p.splits; ++k) bad |= p.bad[b * p.splits + k];
  if (r == 0 && threadIdx.x == 0) p.bad_request[b] = bad;
  T* out = static_cast<T*>(p.out) + (b * rows_total + r) * p.lat;
  if (bad) {  // a cell of this request was not read: no value is right
    for (int64_t d = threadIdx.x; d < p.lat; d += THREADS) from_f(NAN, out + d);
    return;
  }
  float mx = -INFINITY;
  for (int k = 0; k < p.splits; ++k) mx = fmaxf(mx, p.ws[((b * p.splits + k) * rows_total + r) * (p.lat + 2) + p.lat]);
  float denom = 0.f;
  for (int k = 0; k < p.splits; ++k) {
    const float* w = p.ws + ((b * p.splits + k) * rows_total + r) * (p.lat + 2);
    if (w[p.lat] != -INFINITY) denom += __expf(w[p.lat] - mx) * w[p.lat + 1];
  }
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

// Threads per block of the split kernel: each owns output dims threadIdx.x + k x THREADS, k < MAX_DPT.
int longctx_paged_mla_threads() { return THREADS; }

// Largest kv_lora_rank the kernel takes: THREADS threads, MAX_DPT output dims each.
int64_t longctx_paged_mla_max_kv_lora_rank() { return THREADS * MAX_DPT; }

// 4-byte words of workspace the launch needs: the splits' partial states (floats), then the page
// flags (ints) of each split and of each request.
int64_t longctx_paged_mla_workspace_floats(int64_t batch, int64_t splits, int64_t rows, int64_t lat) {
  return batch * splits * rows * (lat + 2) + batch * splits + batch;
}

// Returned where a page id of page_table (for a cell below seq_len) points outside the KV pool.
constexpr int PAGE_OUTSIDE_POOL = -1;

// 0 on success; PAGE_OUTSIDE_POOL (-1) where a page id of a request's cells points outside the pool
// (no cell outside it was read; that request's rows are NaN); else a cudaError_t. dtype 0: fp32,
// 1: bf16. Every pointer is device memory. The page flags are read back (a wait for the stream) on
// every call except while the stream is being captured into a CUDA graph, where nothing may wait:
// there the NaN rows are the only sign.
int longctx_paged_mla_attention(int dtype, const void* q, const void* pool, const int64_t* table, const int64_t* lens,
                                void* out, float* ws, int64_t batch, int64_t n_q, int64_t heads, int64_t dim,
                                int64_t lat, int64_t max_pages, int64_t page_size, int64_t slots, int splits,
                                float scale, cudaStream_t stream) {
  if (dim % 16 != 0 || lat % 16 != 0 || lat > THREADS * MAX_DPT || splits < 1) return cudaErrorInvalidValue;
  int* bad = reinterpret_cast<int*>(ws + batch * splits * n_q * heads * (lat + 2));
  Params p{q, pool, table, lens, out, ws, bad, bad + batch * splits, n_q, heads, dim, lat, max_pages, page_size,
           slots, splits, scale};
  cudaError_t err = dtype == 1 ? launch<__nv_bfloat16>(p, batch, stream) : launch<float>(p, batch, stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess || capture != cudaStreamCaptureStatusNone) return static_cast<int>(err);
  // pinned, so that the copy is one small DMA; one buffer per host thread, grown as needed
  thread_local int* flags = nullptr;
  thread_local int64_t capacity = 0;
  if (capacity < batch) {
    if (flags != nullptr) cudaFreeHost(flags);
    flags = nullptr;
    capacity = 0;
    err = cudaHostAlloc(reinterpret_cast<void**>(&flags), batch * sizeof(int), cudaHostAllocPortable);
    if (err != cudaSuccess) return static_cast<int>(err);
    capacity = batch;
  }
  err = cudaMemcpyAsync(flags, p.bad_request, batch * sizeof(int), cudaMemcpyDeviceToHost, stream);
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return static_cast<int>(err);
  for (int64_t b = 0; b < batch; ++b)
    if (flags[b]) return PAGE_OUTSIDE_POOL;
  return 0;
}

}  // extern "C"
