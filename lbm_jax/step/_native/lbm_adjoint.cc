// Adjoint (vector-Jacobian product) of the plain step of lbm_step.cc, called
// through jax.ffi by lbm_jax/step/_native.py.
//
// Given the step's input f (stored populations, the linearisation point), its
// boundary arrays and constant force, and the cotangent gbar of its output, one
// call computes fbar, the cotangent of f. The codecs are differentiated straight
// through (lbm_jax.core._storage): cotangents are plain values of f's dtype
// (float32, or IEEE float16 for FP32/FP16S, unscaled), decoded to float32,
// summed in float32 and rounded once to the dtype at the end, as the XLA step's
// derivative does.
//
// Per cell, with s_i the pulled (or bounced-back) shifted populations, the step
// computes (BGK with Guo forcing; lbm_jax.core._collision.collide)
//   rho = 1 + sum s_i,  u = (sum c_i s_i + F / 2) / rho
//   out_i = (1 - omega) s_i + omega feq_i(rho, u) + cp w_i (9 (c_i.u)(c_i.F) - 3 u.F)
//   feq_i = w_i (rho - 1) + w_i rho poly_i,  poly_i = 3 cu_i + 4.5 cu_i^2 - 1.5 u.u
// so sbar_k = (1 - omega) gbar_k + rbar + c_k . jbar, where, with W = sum w_i gbar_i,
//   M = sum_i c_i w_i gbar_i (3 omega rho (1 + 3 cu_i) + 9 cp c_i.F)
//   jbar = M / rho - 3 omega W u - 3 cp W F / rho       (the cotangent of j)
//   rbar = omega sum_i w_i gbar_i (1 + poly_i) - jbar . u (the cotangent of rho - 1)
// Fixed cells keep their fixed values: their gbar is zero. Where bounce[x, i] is
// set, s_i(x) = f_{opp i}(x) (+ a wall term, constant in f): sbar_i(x) goes to
// fbar_{opp i}(x) instead of streaming. Pull streaming s_i(x) = f_i(x - c_i)
// transposes into the gather fbar_i(x) = P_i(x + c_i) + B_i(x), with P the
// streamed part of sbar and B the bounced-back part.
//
// Each thread walks its own run of x-planes and keeps the sbar of three planes
// (x - 1, x, x + 1) in a ring: the planes at the ends of a run are computed
// twice, by both neighbouring threads; nothing else is.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "lbm_codecs.h"
#include "lbm_lattices.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace lbm_native;  // codecs and SIMD arithmetic

constexpr int kTileCells = 512;  // cells of one pulled tile (as in lbm_step.cc)

// Cotangents: float32, or IEEE float16 (no scaling: the derivative of the codec
// is the identity on values).
struct CtF32 {
  using T = float;
  static constexpr ffi::DataType kType = ffi::DataType::F32;
  static constexpr uintptr_t kStreamAlign = 32;
  static void stream8(T* p, __m256 v) { _mm256_stream_ps(p, v); }
  static __m256 load8(const T* p) { return _mm256_loadu_ps(p); }
  static float load1(const T* p) { return *p; }
  static void store8(T* p, __m256 v) { _mm256_storeu_ps(p, v); }
  static void store1(T* p, float v) { *p = v; }
};

struct CtF16 {
  using T = uint16_t;
  static constexpr ffi::DataType kType = ffi::DataType::F16;
  static constexpr uintptr_t kStreamAlign = 16;
  static void stream8(T* p, __m256 v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static __m256 load8(const T* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float load1(const T* p) { return _cvtsh_ss(*p); }
  static void store8(T* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
  static void store1(T* p, float v) { *p = _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT); }
};

template <class L>
struct Params {
  float omega;
  float force[3];
  float half_force[3];
  float cp;
  float k2[L::Q];  // 9 cp (c_i . F)

  Params(float omega_, const float* f, float cp_) : omega(omega_), cp(cp_) {
    for (int a = 0; a < 3; ++a) {
      force[a] = a < L::D ? f[a] : 0.0f;
      half_force[a] = 0.5f * force[a];
    }
    for (int i = 0; i < L::Q; ++i) {
      float c = 0.0f;
      for (int a = 0; a < L::D; ++a) c += static_cast<float>(L::C[i][a]) * force[a];
      k2[i] = 9.0f * cp * c;
    }
  }
};

// Cells z .. z + A::width - 1: s_i = s[i * sn + z] (pulled, decoded), gbar_i =
// g[i * gn + z]; writes sbar_i over gbar_i.
template <class L, class A, bool Force>
__attribute__((always_inline)) inline void adjoint_cells(const float* s, int sn, float* g,
                                                         int gn, int z, const Params<L>& p) {
  using V = typename A::V;
  constexpr int Q = L::Q;
  constexpr int D = L::D;
  V sum = A::set(0.0f);
  V j[3] = {A::set(0.0f), A::set(0.0f), A::set(0.0f)};
  unroll<Q>([&](auto i) {
    const V fi = A::load(s + i * sn + z);
    sum = A::add(sum, fi);
    unroll<D>([&](auto a) {
      if constexpr (L::C[i][a] == 1) j[a] = A::add(j[a], fi);
      if constexpr (L::C[i][a] == -1) j[a] = A::sub(j[a], fi);
    });
  });
  const V rho = A::add(sum, A::set(1.0f));
  const V inv = A::div(A::set(1.0f), rho);
  V u[3];
  unroll<D>([&](auto a) {
    u[a] = A::mul(Force ? A::add(j[a], A::set(p.half_force[a])) : j[a], inv);
  });
  V usq = A::mul(u[0], u[0]);
  unroll<D - 1>([&](auto a) { usq = A::fma(u[a + 1], u[a + 1], usq); });
  const V k1 = A::mul(A::set(3.0f * p.omega), rho);  // 3 omega rho
  V w_sum = A::set(0.0f), r_sum = A::set(0.0f);
  V m[3] = {A::set(0.0f), A::set(0.0f), A::set(0.0f)};
  unroll<Q>([&](auto i) {
    const V wg = A::mul(A::set(L::W[i]), A::load(g + i * gn + z));
    w_sum = A::add(w_sum, wg);
    V cu = A::set(0.0f);
    unroll<D>([&](auto a) {
      if constexpr (L::C[i][a] == 1) cu = A::add(cu, u[a]);
      if constexpr (L::C[i][a] == -1) cu = A::sub(cu, u[a]);
    });
    // 1 + poly = 1 + 3 cu + 4.5 cu^2 - 1.5 usq
    const V one_poly = A::fma(A::fma(A::set(4.5f), cu, A::set(3.0f)), cu,
                              A::fma(A::set(-1.5f), usq, A::set(1.0f)));
    r_sum = A::fma(wg, one_poly, r_sum);
    V t = A::mul(k1, A::fma(A::set(3.0f), cu, A::set(1.0f)));
    if constexpr (Force) t = A::add(t, A::set(p.k2[i]));
    t = A::mul(wg, t);
    unroll<D>([&](auto a) {
      if constexpr (L::C[i][a] == 1) m[a] = A::add(m[a], t);
      if constexpr (L::C[i][a] == -1) m[a] = A::sub(m[a], t);
    });
  });
  const V ow = A::mul(A::set(-3.0f * p.omega), w_sum);  // -3 omega W
  V jb[3];
  V rb = A::mul(A::set(p.omega), r_sum);
  unroll<D>([&](auto a) {
    V v = A::fma(ow, u[a], A::mul(m[a], inv));
    if constexpr (Force) v = A::fma(A::mul(A::set(-3.0f * p.cp * p.force[a]), w_sum), inv, v);
    jb[a] = v;
    rb = A::sub(rb, A::mul(v, u[a]));
  });
  const V keep = A::set(1.0f - p.omega);
  unroll<Q>([&](auto i) {
    V out = rb;
    unroll<D>([&](auto a) {
      if constexpr (L::C[i][a] == 1) out = A::add(out, jb[a]);
      if constexpr (L::C[i][a] == -1) out = A::sub(out, jb[a]);
    });
    A::store(g + i * gn + z, A::fma(keep, A::load(g + i * gn + z), out));
  });
}

template <class L, bool Force>
void adjoint_row(const float* s, int sn, float* g, int gn, int n, const Params<L>& p) {
  int z = 0;
  for (; z + 8 <= n; z += 8) adjoint_cells<L, Avx, Force>(s, sn, g, gn, z, p);
  for (; z < n; ++z) adjoint_cells<L, Scalar, Force>(s, sn, g, gn, z, p);
}

// dst[k] = src[(k + shift) mod n] (+ b[k]), k < n, converted to the cotangent
// type: a row assembled in `row` (n floats, in L1), then written with
// non-temporal stores (no read for ownership) where dst is aligned for them.
template <class G>
inline void emit_row(const float* src, int shift, const float* b, float* row,
                     typename G::T* dst, int n) {
  const int first = n - shift;
  for (int k = 0; k < first; ++k) row[k] = src[shift + k];
  for (int k = 0; k < shift; ++k) row[first + k] = src[k];
  if (b)
    for (int k = 0; k < n; ++k) row[k] += b[k];
  int k = 0;
  if (reinterpret_cast<uintptr_t>(dst) % G::kStreamAlign == 0)
    for (; k + 8 <= n; k += 8) G::stream8(dst + k, _mm256_loadu_ps(row + k));
  for (; k + 8 <= n; k += 8) G::store8(dst + k, _mm256_loadu_ps(row + k));
  for (; k < n; ++k) G::store1(dst + k, row[k]);
}

template <class T>
struct Boundary {
  const bool* bounce = nullptr;
  const float* wall = nullptr;
  const bool* fixed_mask = nullptr;
};

template <class L, class S, class G>
struct Adjoint {
  using T = typename S::T;
  using TG = typename G::T;
  static constexpr int Q = L::Q;

  // The sbar of plane x: its streamed part into P (Q, ny, nz) and, with
  // bounce-back, its bounced-back part into B (at the opposite directions).
  static void plane_sbar(const T* f, const TG* ct, const Boundary<T>& bnd, int nx, int ny,
                         int nz, int x, const Params<L>& p, bool force, float* buf,
                         float* P, float* B) {
    const size_t plane = static_cast<size_t>(Q) * ny * nz;
    const int pn = ny * nz;
    const int ty = nz >= kTileCells ? 1 : (ny < kTileCells / nz ? ny : kTileCells / nz);
    const int tz = nz > kTileCells ? kTileCells : nz;
    for (int y0 = 0; y0 < ny; y0 += ty) {
      const int my = ny - y0 < ty ? ny - y0 : ty;
      for (int z0 = 0; z0 < nz; z0 += tz) {
        const int mz = nz - z0 < tz ? nz - z0 : tz;
        const int n = my * mz;
        // pull: buf[i][t * mz + k] = f_i(x - cx, y0 + t - cy, z0 + k - cz)
        for (int i = 0; i < Q; ++i) {
          const int cx = L::C[i][0];
          const int cy = L::D == 3 ? L::C[i][1] : 0;
          const int cz = L::C[i][L::D - 1];
          const int xs = ((x - cx) % nx + nx) % nx;
          const T* src_plane = f + xs * plane;
          const int start = ((z0 - cz) % nz + nz) % nz;
          const int first = mz < nz - start ? mz : nz - start;
          for (int t = 0; t < my; ++t) {
            const int ys = ((y0 + t - cy) % ny + ny) % ny;
            const T* src = src_plane + (static_cast<size_t>(i) * ny + ys) * nz;
            float* dst = buf + static_cast<size_t>(i) * n + static_cast<size_t>(t) * mz;
            decode<S>(src + start, dst, first);
            decode<S>(src, dst + first, mz - first);
          }
        }
        const size_t base = static_cast<size_t>(x) * plane;
        if (bnd.bounce) {
          for (int i = 0; i < Q; ++i)
            for (int t = 0; t < my; ++t) {
              const size_t at = base + (static_cast<size_t>(i) * ny + y0 + t) * nz + z0;
              const size_t opp =
                  base + (static_cast<size_t>(L::OPP[i]) * ny + y0 + t) * nz + z0;
              float* dst = buf + static_cast<size_t>(i) * n + static_cast<size_t>(t) * mz;
              for (int k = 0; k < mz; ++k)
                if (bnd.bounce[at + k]) {
                  const float v = S::load1(f + opp + k);
                  dst[k] = bnd.wall ? v + bnd.wall[at + k] : v;
                }
            }
        }
        // gbar of the tile into P, zero on fixed cells
        for (int i = 0; i < Q; ++i)
          for (int t = 0; t < my; ++t) {
            const size_t row = (static_cast<size_t>(i) * ny + y0 + t) * nz + z0;
            float* dst = P + static_cast<size_t>(i) * pn + (y0 + t) * nz + z0;
            const TG* src = ct + base + row;
            int k = 0;
            for (; k + 8 <= mz; k += 8) _mm256_storeu_ps(dst + k, G::load8(src + k));
            for (; k < mz; ++k) dst[k] = G::load1(src + k);
            if (bnd.fixed_mask) {
              const bool* mask =
                  bnd.fixed_mask + static_cast<size_t>(x) * pn + (y0 + t) * nz + z0;
              for (int k2 = 0; k2 < mz; ++k2)
                if (mask[k2]) dst[k2] = 0.0f;
            }
          }
        // whole rows (z0 = 0, mz = nz) or one piece of a row: the tile's cells
        // of a direction are contiguous in P
        float* g = P + y0 * nz + z0;
        if (force)
          adjoint_row<L, true>(buf, n, g, pn, n, p);
        else
          adjoint_row<L, false>(buf, n, g, pn, n, p);
      }
    }
    if (bnd.bounce) {  // split: bounced-back cells send sbar_i to fbar_{opp i}(x)
      const bool* mask = bnd.bounce + static_cast<size_t>(x) * plane;
      for (int i = 0; i < Q; ++i) {
        float* pi = P + static_cast<size_t>(i) * pn;
        float* bo = B + static_cast<size_t>(L::OPP[i]) * pn;
        const bool* mi = mask + static_cast<size_t>(i) * pn;
        for (int k = 0; k < pn; ++k) {
          bo[k] = mi[k] ? pi[k] : 0.0f;
          pi[k] = mi[k] ? 0.0f : pi[k];
        }
      }
    }
  }

  // fbar of plane x: fbar_i(x, y, z) = P_i(x + cx, y + cy, z + cz) + B_i(x, y, z),
  // with `ring[k]` the P of plane x - 1 + k.
  static void plane_gather(float* const ring[3], const float* B, TG* out, int ny, int nz,
                           float* row_buf) {
    const int pn = ny * nz;
    for (int i = 0; i < Q; ++i) {
      const int cx = L::C[i][0];
      const int cy = L::D == 3 ? L::C[i][1] : 0;
      const int cz = L::C[i][L::D - 1];
      const float* src_plane = ring[1 + cx] + static_cast<size_t>(i) * pn;
      const int start = ((cz % nz) + nz) % nz;
      for (int y = 0; y < ny; ++y) {
        const int ys = ((y + cy) % ny + ny) % ny;
        const float* src = src_plane + static_cast<size_t>(ys) * nz;
        const size_t row = static_cast<size_t>(i) * pn + static_cast<size_t>(y) * nz;
        emit_row<G>(src, start, B ? B + row : nullptr, row_buf, out + row, nz);
      }
    }
  }

  static ffi::Error call(ffi::AnyBuffer f, ffi::AnyBuffer ct, ffi::AnyBuffer bounce,
                         ffi::AnyBuffer wall, ffi::AnyBuffer fixed_mask,
                         ffi::Result<ffi::AnyBuffer> fbar, float omega, int64_t forced,
                         ffi::Span<const float> force, float cp, int64_t threads) {
    if (f.element_type() != S::kType || ct.element_type() != G::kType ||
        fbar->element_type() != G::kType)
      return ffi::Error::InvalidArgument(
          "lbm_adjoint: populations must have the storage dtype and cotangents theirs");
    if (bounce.element_type() != ffi::DataType::PRED ||
        fixed_mask.element_type() != ffi::DataType::PRED ||
        wall.element_type() != ffi::DataType::F32)
      return ffi::Error::InvalidArgument(
          "lbm_adjoint: boundary masks must be bool and wall terms float32");
    auto dims = f.dimensions();
    if (dims.size() != static_cast<size_t>(L::D) + 1 || dims[1] != Q ||
        ct.element_count() != f.element_count() ||
        fbar->element_count() != f.element_count())
      return ffi::Error::InvalidArgument("lbm_adjoint: arrays have the wrong shape");
    const int nx = static_cast<int>(dims[0]);
    const int ny = L::D == 3 ? static_cast<int>(dims[2]) : 1;
    const int nz = static_cast<int>(dims[L::D]);
    const size_t cells = static_cast<size_t>(nx) * ny * nz;
    const size_t plane = static_cast<size_t>(Q) * ny * nz;
    if (force.size() != static_cast<size_t>(L::D))
      return ffi::Error::InvalidArgument("lbm_adjoint: the force has the wrong size");
    Boundary<T> bnd;
    if (bounce.element_count() != 0) {
      if (bounce.element_count() != cells * Q ||
          (wall.element_count() != 0 && wall.element_count() != cells * Q))
        return ffi::Error::InvalidArgument(
            "lbm_adjoint: bounce-back arrays have the wrong size");
      bnd.bounce = static_cast<const bool*>(bounce.untyped_data());
      if (wall.element_count() != 0) bnd.wall = static_cast<const float*>(wall.untyped_data());
    }
    if (fixed_mask.element_count() != 0) {
      if (fixed_mask.element_count() != cells)
        return ffi::Error::InvalidArgument("lbm_adjoint: the fixed mask has the wrong size");
      bnd.fixed_mask = static_cast<const bool*>(fixed_mask.untyped_data());
    }
    const T* fp = static_cast<const T*>(f.untyped_data());
    const TG* cp_in = static_cast<const TG*>(ct.untyped_data());
    TG* out = static_cast<TG*>(fbar->untyped_data());
    const Params<L> params(omega, force.begin(), cp);
    const bool has_force = forced != 0;
    const int runs = static_cast<int>(threads < 1 ? 1 : threads < nx ? threads : nx);
    const int ty = nz >= kTileCells ? 1 : (ny < kTileCells / nz ? ny : kTileCells / nz);
    const int tz = nz > kTileCells ? kTileCells : nz;
#pragma omp parallel for schedule(static, 1) num_threads(runs)
    for (int r = 0; r < runs; ++r) {
      const int x0 = static_cast<int>(static_cast<int64_t>(nx) * r / runs);
      const int x1 = static_cast<int>(static_cast<int64_t>(nx) * (r + 1) / runs);
      std::vector<float> buf(static_cast<size_t>(Q) * ty * tz);
      std::vector<float> ring(3 * plane), bring(bnd.bounce ? 3 * plane : 0);
      std::vector<float> row_buf(static_cast<size_t>(nz));
      auto P = [&](int x) { return ring.data() + static_cast<size_t>((x + 3) % 3) * plane; };
      auto B = [&](int x) {
        return bnd.bounce ? bring.data() + static_cast<size_t>((x + 3) % 3) * plane
                          : nullptr;
      };
      auto sbar = [&](int x) {  // x in [-1, nx]: plane x mod nx into slot x mod 3
        plane_sbar(fp, cp_in, bnd, nx, ny, nz, (x + nx) % nx, params, has_force,
                   buf.data(), P(x), B(x));
      };
      sbar(x0 - 1);
      sbar(x0);
      for (int x = x0; x < x1; ++x) {
        sbar(x + 1);
        float* const planes[3] = {P(x - 1), P(x), P(x + 1)};
        plane_gather(planes, B(x), out + static_cast<size_t>(x) * plane, ny, nz,
                     row_buf.data());
      }
      _mm_sfence();  // order the non-temporal stores before returning
    }
    return ffi::Error::Success();
  }
};

}  // namespace

#define LBM_DEFINE_ADJOINT(LAT, STORE, CT, NAME)                             \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (Adjoint<LAT, STORE, CT>::call),       \
                                ffi::Ffi::Bind()                             \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Attr<float>("omega")                    \
                                    .Attr<int64_t>("forced")                 \
                                    .Attr<ffi::Span<const float>>("force")   \
                                    .Attr<float>("cp")                       \
                                    .Attr<int64_t>("threads"));

LBM_DEFINE_ADJOINT(D2Q9, Fp32, CtF32, lbm_adjoint_D2Q9_fp32)
LBM_DEFINE_ADJOINT(D2Q9, Fp16s, CtF16, lbm_adjoint_D2Q9_fp16s)
LBM_DEFINE_ADJOINT(D3Q19, Fp32, CtF32, lbm_adjoint_D3Q19_fp32)
LBM_DEFINE_ADJOINT(D3Q19, Fp16s, CtF16, lbm_adjoint_D3Q19_fp16s)
LBM_DEFINE_ADJOINT(D3Q27, Fp32, CtF32, lbm_adjoint_D3Q27_fp32)
LBM_DEFINE_ADJOINT(D3Q27, Fp16s, CtF16, lbm_adjoint_D3Q27_fp16s)
