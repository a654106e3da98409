// CPU twin of the paged MLA decode attention kernel (absorbed form), a PyTorch C++ extension.
//
// The same algorithm as kernels/cuda/paged_mla_decode.cu, on CPU threads instead of thread blocks:
//  * flash-decoding: each request's KV sequence is cut into splits, one work item per (request,
//    split) spread over the threads (at::parallel_for), so one long request keeps every core busy;
//    a second pass merges the splits' partial softmax states;
//  * each latent cell is read once per split and used by every head and every query token (MLA:
//    all heads share the cell), through the page table, page_size 1 included;
//  * online softmax over tiles of 64 cells (four 16-cell score vectors, one max and one rescale per
//    tile); scores, exp, and the value update are 16-lane vector code (GCC/Clang vector extensions,
//    -O3 -march=native), with enough independent accumulators that no chain of dependent adds is
//    long (the CPU is latency-bound long before it is FMA-bound);
//  * the next tile's cells are prefetched to L2 a few lines at a time, spread over this tile's
//    arithmetic: scattered slots defeat the hardware prefetcher, and a core holds only ~16 misses in
//    flight, so a burst of a tile's lines would stall the arithmetic instead of overlapping it.
//
// Shapes (one layer), as in kernels/reference/paged_mla_decode.py:
//   q          [batch, n_q, heads, dim]  dim = kv_lora_rank + rope; n_q = 1 for decode, K for verify
//   kv_pool    [slots, dim]              one latent cell per token slot
//   page_table [batch, max_pages] int64  token t of request b: page_table[b, t / ps] * ps + t % ps
//   seq_lens   [batch] int64             cells in the cache per request, the n_q new ones included
//   out        [batch, n_q, heads, kv_lora_rank]
// Query j of a request of n cells sees cells 0 .. n - n_q + j (causal among the n_q new tokens).
// fp32 and bf16 (accumulated in fp32).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// 16 floats: one AVX-512 register (two AVX2 ones); GCC/Clang vector extensions, portable.
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
constexpr int64_t W = 16;              // lanes: cells per score vector
constexpr int64_t GROUPS = 4;          // groups of W cells per online-softmax step
constexpr int64_t TILE = GROUPS * W;   // cells per online-softmax step
constexpr int64_t MIN_SPLIT = 512;     // fewest tokens a split is given
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline v16 vload(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline v16 splat(float x) { return v16{} + x; }

// exp(x) for x <= 0 (scores minus their running max), 16 at a time: 2^(x log2 e) split into an
// integer power (exponent bits) and a degree-6 polynomial on [-0.5, 0.5]; relative error ~2e-7.
// Arguments below -87 (and -inf, for masked cells) give 0.
inline v16 vexp(v16 x) {
  const v16 lo = splat(-87.f);
  const v16i dead = x < lo;
  x = dead ? lo : x;
  const v16 t = x * 1.44269504088896341f;
  const v16 n = (t + 12582912.f) - 12582912.f;  // round to nearest: the 1.5 x 2^23 trick
  const v16 f = t - n;
  v16 p = splat(1.5353362e-4f);
  p = p * f + 1.3398874e-3f;
  p = p * f + 9.6180290e-3f;
  p = p * f + 5.5503406e-2f;
  p = p * f + 2.4022650e-1f;
  p = p * f + 6.9314718e-1f;
  p = p * f + 1.0f;
  const v16i bits = (__builtin_convertvector(n, v16i) + 127) << 23;
  v16 scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const v16 r = p * scale;
  return dead ? splat(0.f) : r;
}

// Pairwise sums of two vectors' lanes, interleaved so that 16 vectors reduce to one vector of 16
// totals in four levels (45 operations instead of 16 full horizontal sums).
inline v16 sum16(v16* x) {
  v16 y[8], z[4], u[2];
  for (int k = 0; k < 8; ++k)
    y[k] = __builtin_shufflevector(x[2 * k], x[2 * k + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
           __builtin_shufflevector(x[2 * k], x[2 * k + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  for (int k = 0; k < 4; ++k)
    z[k] = __builtin_shufflevector(y[2 * k], y[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(y[2 * k], y[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  for (int k = 0; k < 2; ++k)
    u[k] = __builtin_shufflevector(z[2 * k], z[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29) +
           __builtin_shufflevector(z[2 * k], z[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31);
  return __builtin_shufflevector(u[0], u[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30) +
         __builtin_shufflevector(u[0], u[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }
// horizontal max and sum of the 16 lanes, in four shuffle steps
inline float hmax(v16 v) {
  v = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
  v = vmax(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
  v = vmax(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
  v = vmax(v, __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
  return v[0];
}
inline float hsum(v16 v) {
  v += __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
  v += __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
  v += __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
  v += __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  return v[0];
}

// 16 elements of a cell as fp32
inline v16 load16(const float* p) { return vload(p); }
inline v16 load16(const c10::BFloat16* p) {
  typedef uint16_t v16h __attribute__((vector_size(32)));
  typedef uint32_t v16u __attribute__((vector_size(64)));
  v16h h;
  std::memcpy(&h, p, sizeof h);
  const v16u bits = __builtin_convertvector(h, v16u) << 16;
  v16 f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// n (a multiple of 16) elements as fp32
template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
  for (int64_t k = 0; k < n; k += W) vstore(dst + k, load16(src + k));
}

// Prefetches the lines of a list of cells a few at a time, one step per inner iteration of the
// arithmetic: a core has few buffers for outstanding misses, so lines asked for in bursts wait for
// them (stalling the arithmetic), while lines asked for evenly keep them busy under the arithmetic.
struct Prefetcher {
  const void* const* cells = nullptr;
  int64_t n = 0, next = 0, bytes = 0, per_step = 0;
  uintptr_t line = 0, end = 0;
  void start(const void* const* c, int64_t count, int64_t cell_bytes, int64_t steps) {
    cells = c, n = count, next = 0, bytes = cell_bytes, line = end = 0;
    const int64_t lines = count * ((cell_bytes + 63) / 64 + 1);
    per_step = steps > 0 ? (lines + steps - 1) / steps : lines;
  }
  inline void step() {
    for (int64_t k = 0; k < per_step; ++k) {
      if (line >= end) {
        if (next >= n) return;
        const uintptr_t p = reinterpret_cast<uintptr_t>(cells[next++]);
        line = p & ~uintptr_t{63};
        end = p + bytes;
      }
      __builtin_prefetch(reinterpret_cast<const void*>(line), 0, 1);  // to L2
      asm volatile("" : : "r"(line));  // GCC deletes loops whose only effect is prefetching
      line += 64;
    }
  }
  void finish() {  // whatever the steps did not reach, at once
    per_step = std::numeric_limits<int64_t>::max();
    step();
  }
};

// scores of one query row against 16 cells (q was scaled by sm_scale)
inline v16 group_scores(const float* q, const float* const* kv, int64_t chunks, Prefetcher& pf) {
  v16 acc[W];
  for (int i = 0; i < W; ++i) acc[i] = v16{};
  for (int64_t k = 0; k < chunks; ++k) {
    const v16 qk = vload(q + k * W);
    for (int i = 0; i < W; ++i) acc[i] += qk * vload(kv[i] + k * W);
    pf.step();
  }
  return sum16(acc);
}

// acc[0:lat] += sum_i p[i] * kv[i][0:lat] over n cells (n even): blocks of four chunks, each with
// two accumulator chains (cells alternate), so that no chain is longer than n / 2 FMAs
inline void tile_values(const float* p, const float* const* kv, int64_t n, int64_t lat_chunks, float* acc, Prefetcher& pf) {
  int64_t k = 0;
  for (; k + 4 <= lat_chunks; k += 4) {
    v16 o[8];
    for (int j = 0; j < 8; ++j) o[j] = v16{};
    for (int64_t i = 0; i < n; i += 2) {
      const float* x = kv[i] + k * W;
      const float* y = kv[i + 1] + k * W;
      const float px = p[i], py = p[i + 1];
      for (int j = 0; j < 4; ++j) {
        o[j] += px * vload(x + j * W);
        o[4 + j] += py * vload(y + j * W);
      }
      pf.step();
    }
    for (int j = 0; j < 4; ++j) vstore(acc + (k + j) * W, vload(acc + (k + j) * W) + (o[j] + o[4 + j]));
  }
  for (; k < lat_chunks; ++k) {
    v16 o0 = v16{}, o1 = v16{};
    for (int64_t i = 0; i < n; i += 2) {
      o0 += p[i] * vload(kv[i] + k * W);
      o1 += p[i + 1] * vload(kv[i + 1] + k * W);
      pf.step();
    }
    vstore(acc + k * W, vload(acc + k * W) + (o0 + o1));
  }
}

// A tile's cells as fp32 rows: fp32 cells are read where they are, bf16 ones converted into buf.
inline void tile_rows(const float* const* cells, int64_t n, int64_t, float*, const float** rows) {
  for (int64_t i = 0; i < n; ++i) rows[i] = cells[i];
}
template <typename T>
inline void tile_rows(const T* const* cells, int64_t n, int64_t dim, float* buf, const float** rows) {
  for (int64_t i = 0; i < n; ++i) {
    to_float(cells[i], buf + i * dim, dim);
    rows[i] = buf + i * dim;
  }
}

struct Shape {
  int64_t batch, n_q, heads, dim, lat, max_pages, page_size, slots, splits;
  float scale;
};

// Partial softmax state of one (request, split): per (query, head) row the running max, the sum
// of exp(score - max) and the unnormalised output.
struct Partial {
  float* m;    // [rows]
  float* l;    // [rows]
  float* acc;  // [rows, lat]
};

template <typename T>
void attend_split(const Shape& s, const float* qf, const T* pool, const int64_t* pages, int64_t n,
                  int64_t t0, int64_t t1, Partial part, std::atomic<bool>& bad_slot) {
  const int64_t rows = s.n_q * s.heads, dim = s.dim, lat = s.lat, chunks = dim / W;
  std::vector<float> zeros(dim, 0.f), buf(std::is_same<T, float>::value ? 0 : TILE * dim);
  std::vector<v16> lsum(rows, v16{});  // per row, the softmax denominator lane by lane
  alignas(64) float pv[TILE];
  const T* cell[TILE];
  const float* kv[TILE];
  const T* ahead[TILE];
  for (int64_t r = 0; r < rows; ++r) part.m[r] = NEG_INF;
  std::fill(part.acc, part.acc + rows * lat, 0.f);
  // slot of token t; an integer division per token would cost more than the token's arithmetic, so
  // page sizes that are powers of two (1 included) shift and mask instead
  const int64_t ps = s.page_size;
  const int shift = (ps & (ps - 1)) == 0 ? __builtin_ctzll(static_cast<unsigned long long>(ps)) : -1;
  auto slot_of = [&](int64_t t) {
    return shift >= 0 ? (pages[t >> shift] << shift) + (t & (ps - 1)) : pages[t / ps] * ps + t % ps;
  };
  const int64_t cell_bytes = dim * static_cast<int64_t>(sizeof(T));
  // cells [from, to) that lie in the pool, into ahead[]; their count
  auto cells_ahead = [&](int64_t from, int64_t to) {
    int64_t k = 0;
    for (int64_t t = from; t < std::min(to, t1); ++t) {
      const int64_t slot = slot_of(t);
      if (slot >= 0 && slot < s.slots) ahead[k++] = pool + slot * dim;
    }
    return k;
  };
  Prefetcher first;  // the first tile, at once
  first.start(reinterpret_cast<const void* const*>(ahead), cells_ahead(t0, t0 + TILE), cell_bytes, 0);
  first.finish();
  v16 lane;  // 0, 1, ..., 15
  for (int i = 0; i < W; ++i) lane[i] = static_cast<float>(i);
  for (int64_t a = t0; a < t1; a += TILE) {
    const int64_t nt = std::min(TILE, t1 - a), groups = (nt + W - 1) / W;
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t slot = slot_of(a + i);
      if (slot < 0 || slot >= s.slots) {
        bad_slot = true;
        return;
      }
      cell[i] = pool + slot * dim;
    }
    // The next tile's cells are prefetched under this tile's arithmetic, a few lines per inner step
    // (steps: per row, a group's score chunks and the value loop's pairs of cells).
    const int64_t n_ahead = cells_ahead(a + TILE, a + 2 * TILE);
    tile_rows(cell, nt, dim, buf.data(), kv);
    for (int64_t i = nt; i < groups * W; ++i) kv[i] = zeros.data();  // a short last tile is padded: masked below
    const int64_t lc = lat / W, steps_per_row = groups * chunks + groups * W / 2 * (lc / 4 + lc % 4);
    Prefetcher pf;
    pf.start(reinterpret_cast<const void* const*>(ahead), n_ahead, cell_bytes, rows * steps_per_row);
    for (int64_t j = 0; j < s.n_q; ++j) {
      // query j sees cells [0, n - n_q + j]: cells at or past `open` are in its future (or padding)
      const int64_t open = std::min(nt, n - s.n_q + j + 1 - a);
      if (open <= 0) continue;
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t r = j * s.heads + h;
        v16 sc[GROUPS];
        v16 mx = splat(NEG_INF);
        for (int64_t g = 0; g < groups; ++g) {
          sc[g] = group_scores(qf + r * dim, kv + g * W, chunks, pf);
          if (open < (g + 1) * W)  // lanes of cells in the query's future or past the tile's end
            sc[g] = lane + static_cast<float>(g * W) >= static_cast<float>(open) ? splat(NEG_INF) : sc[g];
          mx = vmax(mx, sc[g]);
        }
        const float m_old = part.m[r], m_new = std::max(m_old, hmax(mx));
        float* acc = part.acc + r * lat;
        if (m_new > m_old && m_old != NEG_INF) {
          const float alpha = std::exp(m_old - m_new);
          lsum[r] *= alpha;
          for (int64_t c = 0; c < lat; c += W) vstore(acc + c, vload(acc + c) * alpha);
        }
        part.m[r] = m_new;
        for (int64_t g = 0; g < groups; ++g) {
          const v16 p = vexp(sc[g] - m_new);  // masked lanes (-inf) give 0
          lsum[r] += p;
          vstore(pv + g * W, p);
        }
        tile_values(pv, kv, groups * W, lat / W, acc, pf);
      }
    }
    pf.finish();
  }
  for (int64_t r = 0; r < rows; ++r) part.l[r] = hsum(lsum[r]);
}

template <typename T>
void run(const Shape& s, const T* q, const T* pool, const int64_t* table, const int64_t* lens, T* out) {
  const int64_t rows = s.n_q * s.heads, lat = s.lat, items = s.batch * s.splits;
  std::vector<float> m(items * rows), l(items * rows), acc(items * rows * lat);
  std::vector<int64_t> used(items, 0);  // 1 where the split holds cells
  std::atomic<bool> bad_slot{false};
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    for (int64_t it = begin; it < end; ++it) {
      const int64_t b = it / s.splits, k = it % s.splits, n = lens[b];
      const int64_t per = (n + s.splits - 1) / s.splits;
      const int64_t t0 = std::min(n, k * per), t1 = std::min(n, t0 + per);
      if (t0 >= t1) continue;
      // each item converts its request's queries itself: items need no ordering between them
      std::vector<float> qlocal(rows * s.dim);
      to_float(q + b * rows * s.dim, qlocal.data(), rows * s.dim);
      for (float& x : qlocal) x *= s.scale;
      Partial part{m.data() + it * rows, l.data() + it * rows, acc.data() + it * rows * lat};
      attend_split(s, qlocal.data(), pool, table + b * s.max_pages, n, t0, t1, part, bad_slot);
      used[it] = 1;
    }
  });
  TORCH_CHECK(!bad_slot, "paged_mla_decode: a page id in page_table points outside the KV pool");
  // Merge the splits: out = sum_k e^(m_k - M) acc_k / sum_k e^(m_k - M) l_k.
  at::parallel_for(0, s.batch * rows, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> o(lat);
    for (int64_t br = begin; br < end; ++br) {
      const int64_t b = br / rows, r = br % rows;
      float mx = NEG_INF;
      for (int64_t k = 0; k < s.splits; ++k) {
        const int64_t it = b * s.splits + k;
        if (used[it]) mx = std::max(mx, m[it * rows + r]);
      }
      std::fill(o.begin(), o.end(), 0.f);
      float denom = 0.f;
      for (int64_t k = 0; k < s.splits; ++k) {
        const int64_t it = b * s.splits + k;
        if (!used[it] || m[it * rows + r] == NEG_INF) continue;
        const float w = std::exp(m[it * rows + r] - mx);
        denom += w * l[it * rows + r];
        const float* a = acc.data() + (it * rows + r) * lat;
#pragma omp simd
        for (int64_t d = 0; d < lat; ++d) o[d] += w * a[d];
      }
      T* dst = out + br * lat;
      const float inv = 1.f / denom;
      for (int64_t d = 0; d < lat; ++d) dst[d] = static_cast<T>(o[d] * inv);
    }
  });
}

torch::Tensor paged_mla_attention(torch::Tensor q, torch::Tensor kv_pool, torch::Tensor page_table,
                                  torch::Tensor seq_lens, int64_t page_size, int64_t kv_lora_rank,
                                  double sm_scale, c10::optional<torch::Tensor> out_opt, int64_t num_splits) {
  TORCH_CHECK(q.device().is_cpu() && kv_pool.device().is_cpu(), "the CPU twin takes CPU tensors");
  TORCH_CHECK(q.dim() == 4, "q must be [batch, n_q, heads, dim], got ", q.sizes());
  TORCH_CHECK(kv_pool.dim() == 2, "kv_pool must be [slots, dim], got ", kv_pool.sizes());
  TORCH_CHECK(q.scalar_type() == kv_pool.scalar_type(), "q and kv_pool must have one dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16, "dtype must be float32 or bfloat16");
  TORCH_CHECK(page_size >= 1, "page_size must be at least 1");
  const int64_t batch = q.size(0), n_q = q.size(1), heads = q.size(2), dim = q.size(3);
  TORCH_CHECK(kv_pool.size(1) == dim, "q has ", dim, " dims per head but the KV cells have ", kv_pool.size(1));
  TORCH_CHECK(kv_lora_rank >= 1 && kv_lora_rank <= dim, "kv_lora_rank must be in [1, dim]");
  TORCH_CHECK(dim % W == 0 && kv_lora_rank % W == 0, "the CPU twin works on 16-float vectors: dim (", dim,
              ") and kv_lora_rank (", kv_lora_rank, ") must be multiples of 16");
  TORCH_CHECK(kv_pool.size(0) % page_size == 0, "the KV pool's slots must be whole pages");
  auto qc = q.contiguous();
  auto pool = kv_pool.contiguous();
  auto table = page_table.to(at::kLong).contiguous();
  auto lens = seq_lens.to(at::kLong).contiguous();
  TORCH_CHECK(table.dim() == 2 && table.size(0) == batch, "page_table must be [batch, max_pages]");
  TORCH_CHECK(lens.numel() == batch, "seq_lens must hold one length per request");
  const int64_t* lp = lens.data_ptr<int64_t>();
  int64_t max_len = 0;
  for (int64_t b = 0; b < batch; ++b) {
    TORCH_CHECK(lp[b] >= n_q, "request ", b, " has ", lp[b], " cells, fewer than its ", n_q, " query tokens");
    TORCH_CHECK((lp[b] + page_size - 1) / page_size <= table.size(1), "request ", b, " needs more pages than page_table holds");
    max_len = std::max(max_len, lp[b]);
  }
  torch::Tensor out = out_opt.has_value() ? *out_opt : torch::empty({batch, n_q, heads, kv_lora_rank}, q.options());
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == q.scalar_type(), "out must be contiguous, of q's dtype");
  TORCH_CHECK(out.numel() == batch * n_q * heads * kv_lora_rank, "out must be [batch, n_q, heads, kv_lora_rank]");
  int64_t splits = num_splits;
  if (splits <= 0) {  // enough items for every thread a few times over, each at least MIN_SPLIT tokens
    const int64_t want = (4 * at::get_num_threads() + batch - 1) / batch;
    splits = std::max<int64_t>(1, std::min(want, (max_len + MIN_SPLIT - 1) / MIN_SPLIT));
  }
  Shape s{batch, n_q, heads, dim, kv_lora_rank, table.size(1), page_size, pool.size(0), splits,
          static_cast<float>(sm_scale)};
  if (q.scalar_type() == at::kFloat) {
    run<float>(s, qc.data_ptr<float>(), pool.data_ptr<float>(), table.data_ptr<int64_t>(), lp, out.data_ptr<float>());
  } else {
    run<c10::BFloat16>(s, qc.data_ptr<c10::BFloat16>(), pool.data_ptr<c10::BFloat16>(), table.data_ptr<int64_t>(), lp,
                       out.data_ptr<c10::BFloat16>());
  }
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "CPU twin of the paged MLA decode / verify attention kernel (flash-decoding splits, page table)";
  m.def("paged_mla_attention", &paged_mla_attention, "paged MLA attention for n_q query tokens per request",
        py::arg("q"), py::arg("kv_pool"), py::arg("page_table"), py::arg("seq_lens"), py::arg("page_size"),
        py::arg("kv_lora_rank"), py::arg("sm_scale"), py::arg("out") = py::none(), py::arg("num_splits") = 0);
}
