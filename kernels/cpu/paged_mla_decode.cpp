// CPU twin of the paged MLA decode attention kernel (absorbed form), a PyTorch C++ extension.
//
// The same algorithm as kernels/cuda/paged_mla_decode.cu, on CPU threads instead of thread blocks:
//  * flash-decoding: each request's KV sequence is cut into splits, one work item per (request,
//    split) spread over the threads (at::parallel_for), so one long request keeps every core busy;
//    a second pass merges the splits' partial softmax states;
//  * each latent cell is read once per split and used by every head and every query token (MLA:
//    all heads share the cell), through the page table, page_size 1 included;
//  * cells are gathered a tile at a time into a small buffer that stays in L1, with the next
//    tile's cells prefetched (scattered slots defeat the hardware prefetcher);
//  * online softmax per tile (one rescale per tile, not per token); dot products and the value
//    update are vectorised (omp simd, -O3 -march=native).
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
#include <vector>

namespace {

// 16 floats: one AVX-512 register (two AVX2 ones); GCC/Clang vector extensions, portable.
typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
constexpr int64_t W = 16;           // lanes; also the tile: KV tokens per online-softmax step
constexpr int64_t MIN_SPLIT = 512;  // fewest tokens a split is given
constexpr int64_t PREFETCH_TILES = 4;  // cells are prefetched this many tiles before they are used
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

inline v16 vload(const float* p) {
  v16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void vstore(float* p, v16 v) { std::memcpy(p, &v, sizeof v); }
inline v16 splat(float x) { return v16{} + x; }

inline float load(float x) { return x; }
inline float load(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

template <typename T>
inline void to_float(const T* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = load(src[i]);
}

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

inline float hmax(v16 v) {
  float m = v[0];
  for (int k = 1; k < W; ++k) m = std::max(m, v[k]);
  return m;
}

// scores of one query row against the tile's 16 cells
inline v16 tile_scores(const float* q, const float* const* kv, int64_t dim) {
  v16 acc[W];
  for (int i = 0; i < W; ++i) acc[i] = v16{};
  for (int64_t c = 0; c < dim; c += W) {
    const v16 qc = vload(q + c);
    for (int i = 0; i < W; ++i) acc[i] += qc * vload(kv[i] + c);
  }
  return sum16(acc);
}

// The tile's cells as fp32 rows: fp32 cells are read where they are, bf16 ones converted into buf.
inline void tile_rows(const float* const* cells, int64_t nt, int64_t, float*, const float* zeros, const float** rows) {
  for (int64_t i = 0; i < W; ++i) rows[i] = i < nt ? cells[i] : zeros;
}
template <typename T>
inline void tile_rows(const T* const* cells, int64_t nt, int64_t dim, float* buf, const float* zeros, const float** rows) {
  for (int64_t i = 0; i < W; ++i) {
    if (i < nt) {
      to_float(cells[i], buf + i * dim, dim);
      rows[i] = buf + i * dim;
    } else {
      rows[i] = zeros;
    }
  }
}

inline void prefetch_cell(const char* p, int64_t bytes) {
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(p + off, 0, 1);
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
  const int64_t rows = s.n_q * s.heads, dim = s.dim, lat = s.lat;
  std::vector<float> buf(W * dim), zeros(dim, 0.f);
  const T* cell[W];
  const float* kv[W];
  for (int64_t r = 0; r < rows; ++r) {
    part.m[r] = NEG_INF;
    part.l[r] = 0.f;
  }
  std::fill(part.acc, part.acc + rows * lat, 0.f);
  // slot of token t; an integer division per token would cost more than the token's arithmetic, so
  // page sizes that are powers of two (1 included) shift and mask instead
  const int64_t ps = s.page_size;
  const int shift = (ps & (ps - 1)) == 0 ? __builtin_ctzll(static_cast<unsigned long long>(ps)) : -1;
  auto slot_of = [&](int64_t t) {
    return shift >= 0 ? (pages[t >> shift] << shift) + (t & (ps - 1)) : pages[t / ps] * ps + t % ps;
  };
  const int64_t cell_bytes = dim * static_cast<int64_t>(sizeof(T));
  auto prefetch = [&](int64_t from, int64_t to) {
    for (int64_t i = from; i < std::min(to, t1); ++i) {
      const int64_t slot = slot_of(i);
      if (slot >= 0 && slot < s.slots) prefetch_cell(reinterpret_cast<const char*>(pool + slot * dim), cell_bytes);
    }
  };
  prefetch(t0, t0 + PREFETCH_TILES * W);
  for (int64_t a = t0; a < t1; a += W) {
    const int64_t nt = std::min(W, t1 - a);
    for (int64_t i = 0; i < nt; ++i) {
      const int64_t slot = slot_of(a + i);
      if (slot < 0 || slot >= s.slots) {
        bad_slot = true;
        return;
      }
      cell[i] = pool + slot * dim;
    }
    prefetch(a + PREFETCH_TILES * W, a + (PREFETCH_TILES + 1) * W);
    tile_rows(cell, nt, dim, buf.data(), zeros.data(), kv);  // a last, short tile is padded: masked below
    for (int64_t j = 0; j < s.n_q; ++j) {
      // query j sees cells [0, n - n_q + j]: lanes at or past `open` are in its future (or padding)
      const int64_t open = std::min(nt, n - s.n_q + j + 1 - a);
      if (open <= 0) continue;
      v16i future;
      for (int i = 0; i < W; ++i) future[i] = i >= open ? -1 : 0;
      for (int64_t h = 0; h < s.heads; ++h) {
        const int64_t r = j * s.heads + h;
        v16 sc = tile_scores(qf + r * dim, kv, dim);  // q was scaled by sm_scale
        sc = future ? splat(NEG_INF) : sc;
        const float m_new = std::max(part.m[r], hmax(sc));
        float* acc = part.acc + r * lat;
        if (part.m[r] != NEG_INF && part.m[r] != m_new) {
          const float alpha = std::exp(part.m[r] - m_new);
          part.l[r] *= alpha;
          for (int64_t c = 0; c < lat; c += W) vstore(acc + c, vload(acc + c) * alpha);
        }
        part.m[r] = m_new;
        const v16 p = vexp(sc - m_new);  // masked lanes (-inf) give 0
        float psum = 0.f;
        for (int i = 0; i < W; ++i) psum += p[i];
        part.l[r] += psum;
        for (int64_t c = 0; c < lat; c += W) {  // one accumulator vector over the whole tile
          v16 o = vload(acc + c);
          for (int i = 0; i < W; ++i) o += p[i] * vload(kv[i] + c);
          vstore(acc + c, o);
        }
      }
    }
  }
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
