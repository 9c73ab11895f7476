// The free-surface (volume-of-fluid) step of lbm_jax, called through jax.ffi.
//
// One call computes one step of lbm_jax.free_surface.FreeSurface (the XLA
// model in lbm_jax/free_surface/_xla_step.py is the reference; its docstring
// states the physics) in passes over memory that the data dependencies force:
//
//   0. fill: the fill level phi = m / rho of the interface cells (rho from
//      their stored populations) and, per row (x, y), which cells it holds;
//   C. curvature: the unit normal of the smoothed fill, computed only where
//      the curvature of an interface cell reads it, by one separable filter
//      per axis (three passes, each over the z ranges it must fill, stored
//      compactly), then the curvature of every interface cell;
//   1. stream-collide: pull streaming with bounce-back from solid cells and
//      the gas reconstruction on interface cells, the mass exchange
//      (compensated sum), BGK or TRT collision (relaxation rates constant or
//      from the Smagorinsky model) with gravity as a Guo force, and the
//      conversion marks of interface cells;
//   2. convert: marks applied (filling takes precedence over emptying; fluid
//      next to an emptied cell and gas next to a filled one become interface,
//      the latter initialised from its liquid neighbours' mean rho and u);
//      the excess mass of filled, emptied and clamped cells;
//   3. share: the excess divided among the new interface neighbours;
//   4. gather: each cell adds what it received (compensated sum).
//
// Passes 2-4 visit only the rows holding interface cells or conversion marks;
// pass 1 only the z range of each tile's liquid cells: gas and solid cells
// keep the rest populations (FreeSurface.init gives them those; the XLA step
// writes them every step) and are never read. Populations are in the kernel
// layout (X, Q, Y, Z) (2D lattices: (X, Q, Y), handled as Y = 1, Z = Y); they,
// the flags, mass and carry (grid-shaped) are updated in place (see `run`).
// Every axis is periodic (walls are solid cells). The order of floating-point
// operations follows the XLA model where it is cheap to, but neighbour sums
// run over directions rather than XLA's separable box sums, the smoothed
// gradient is one filter per axis rather than XLA's sequence of smoothings,
// and the compiler contracts no multiply-adds here, so the results agree with
// the XLA model to round-off, not bit for bit.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "lbm_codecs.h"
#include "lbm_free_surface.h"
#include "lbm_lattices.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

using namespace lbm_native;  // codecs, SIMD arithmetic, the grid and its passes

template <class L, class S>
struct FreeSurfaceStep : FreeSurfaceGrid<L, S> {
  using B = FreeSurfaceGrid<L, S>;
  using T = typename S::T;
  static constexpr int Q = L::Q;
  static constexpr int D = L::D;
  using B::nx; using B::ny; using B::nz; using B::rows; using B::cells;
  using B::plane; using B::p; using B::f; using B::g; using B::flags;
  using B::mass; using B::carry; using B::fs; using B::work;
  using B::row; using B::row2; using B::lo; using B::hi;
  using B::llo; using B::lhi; using B::rest; using B::cell; using B::pop; using B::up;
  using B::cx; using B::cy; using B::cz; using B::equilibrium; using B::curvature_pass;
  using B::fill_pass; using B::ranges; using B::curvature_fields; using B::convert_pass; using B::share_pass;
  using B::gather_pass;

  // ------------------------------------------------------------ pass 1
  // BGK or TRT with Guo forcing by the force density rho g, on cells
  // z .. z + width - 1 of the Q rows buf[i * n + z], in place; rho and u into
  // rho_t and u_t. The relaxation rates are the model's, or each cell's from
  // the Smagorinsky model, as lbm_jax.core._collision.collide computes them.
  template <class A, bool Force>
  void collide(float* buf, int n, int z, float* rho_t, float* u_t) const {
    using V = typename A::V;
    V fi[Q], neq[Q], cu[Q], cf[Q];
    V s = A::set(0.0f);
    V j[3] = {A::set(0.0f), A::set(0.0f), A::set(0.0f)};
    unroll<Q>([&](auto i) {
      fi[i] = A::load(buf + i * n + z);
      s = A::add(s, fi[i]);
      unroll<D>([&](auto a) {
        if constexpr (L::C[i][a] == 1) j[a] = A::add(j[a], fi[i]);
        if constexpr (L::C[i][a] == -1) j[a] = A::sub(j[a], fi[i]);
      });
    });
    const V rho = A::add(s, A::set(1.0f));
    const V inv = A::div(A::set(1.0f), rho);
    V u[3], force[3];
    V usq = A::set(0.0f), uf = A::set(0.0f);
    unroll<D>([&](auto a) {
      force[a] = A::mul(rho, A::set(p.g[a]));
      u[a] = Force ? A::mul(A::add(j[a], A::mul(A::set(0.5f), force[a])), inv)
                   : A::mul(j[a], inv);
      usq = A::add(usq, A::mul(u[a], u[a]));
      if (Force) uf = A::add(uf, A::mul(u[a], force[a]));
      A::store(u_t + a * n + z, u[a]);
    });
    A::store(rho_t + z, rho);
    unroll<Q>([&](auto i) {  // the non-equilibrium parts
      cu[i] = A::set(0.0f), cf[i] = A::set(0.0f);
      unroll<D>([&](auto a) {
        constexpr int c = L::C[i][a];
        if constexpr (c == 1) cu[i] = A::add(cu[i], u[a]), cf[i] = A::add(cf[i], force[a]);
        if constexpr (c == -1) cu[i] = A::sub(cu[i], u[a]), cf[i] = A::sub(cf[i], force[a]);
      });
      const V w = A::set(L::W[i]);
      const V poly = A::sub(A::add(A::mul(A::set(3.0f), cu[i]),
                                   A::mul(A::set(4.5f), A::mul(cu[i], cu[i]))),
                            A::mul(A::set(1.5f), usq));
      const V feq = A::add(A::mul(A::mul(w, rho), poly), A::mul(w, s));
      neq[i] = A::sub(fi[i], feq);
    });
    V wp = A::set(p.omega), wm = A::set(p.omega_minus), cp = A::set(p.cp), cm = A::set(p.cm);
    if (p.smagorinsky) {  // tau from the non-equilibrium stress |Pi|
      V pi2 = A::set(0.0f);
      unroll<D>([&](auto a) {
        unroll<D>([&](auto b) {
          V pab = A::set(0.0f);
          unroll<Q>([&](auto i) {
            constexpr int c = L::C[i][a] * L::C[i][b];
            if constexpr (c == 1) pab = A::add(pab, neq[i]);
            if constexpr (c == -1) pab = A::sub(pab, neq[i]);
          });
          pi2 = A::add(pi2, A::mul(pab, pab));
        });
      });
      const V tau0 = A::set(p.tau), half = A::set(0.5f), one = A::set(1.0f);
      const V root = A::sqrt(A::add(A::mul(tau0, tau0),
                                    A::div(A::mul(A::set(p.c2), A::sqrt(pi2)), rho)));
      const V tau = A::mul(half, A::add(tau0, root));
      wp = A::div(one, tau);
      wm = p.trt ? A::div(one, A::add(A::div(A::set(p.magic), A::sub(tau, half)), half)) : wp;
      cp = A::sub(one, A::mul(half, wp));
      cm = A::sub(one, A::mul(half, wm));
    }
    const V hp = A::mul(A::set(0.5f), wp), hm = A::mul(A::set(0.5f), wm);
    unroll<Q>([&](auto i) {
      V out;
      if (p.trt) {
        const V opp = neq[L::OPP[i]];
        out = A::sub(A::sub(fi[i], A::mul(hp, A::add(neq[i], opp))),
                     A::mul(hm, A::sub(neq[i], opp)));
      } else {
        out = A::sub(fi[i], A::mul(wp, neq[i]));
      }
      if constexpr (Force) {
        const V w = A::set(L::W[i]);
        const V sym = A::mul(w, A::sub(A::mul(A::set(9.0f), A::mul(cu[i], cf[i])),
                                       A::mul(A::set(3.0f), uf)));
        const V anti = A::mul(w, A::mul(A::set(3.0f), cf[i]));
        out = A::add(A::add(out, A::mul(cp, sym)), A::mul(cm, anti));
      }
      A::store(buf + i * n + z, out);
    });
  }

  struct Tile {
    std::vector<float> in, own, dm, rho, u;
    std::vector<uint8_t> fl, gas, fluid, kind;
    int x = 0, y0 = 0, ty = 0, z0 = 0, tz = 0;  // the box computed, not yet stored
    explicit Tile(int n)
        : in(Q * n), own(Q * n), dm(n), rho(n), u(3 * n), fl(Q * n), gas(n),
          fluid(n), kind(n) {}
  };

  // Pulls row t of direction i (src: the x-plane's first row of direction i)
  // into dst[0 .. tz), decoding populations or copying flags.
  template <class From, class To, class Copy>
  void pull(const From* src_plane, size_t row_stride, int i, int x, int y, int z0,
            int tz, To* dst, Copy copy) const {
    (void)x;
    const int ys = wrap(y - cy(i), ny);
    const From* src = src_plane + ys * row_stride;
    const int start = wrap(z0 - cz(i), nz);  // z0 < nz, |cz| <= 1
    const int first = tz < nz - start ? tz : nz - start;
    copy(src + start, dst, first);
    copy(src, dst + first, tz - first);
  }

  // Interface cell k of the tile: exchanged mass (with the phi weights), has
  // gas/fluid neighbours and the gas reconstruction of the pulled populations.
  void interface_cell(Tile& t, int n, int k, int x, int y, int z) const {
    const size_t c = cell(x, y, z);
    const float phi = fs[kPhi][c];
    float dm = 0.0f, s0 = 0.0f, j0[3] = {0.0f, 0.0f, 0.0f};
    bool gas = false, fluid = false;
    for (int i = 0; i < Q; ++i) {
      const float v = t.own[i * n + k];
      s0 = s0 + v;
      for (int a = 0; a < D; ++a) j0[a] = j0[a] + static_cast<float>(L::C[i][a]) * v;
    }
    for (int i = 1; i < Q; ++i) {
      const uint8_t fu = t.fl[i * n + k];
      const float df = t.in[i * n + k] - t.own[L::OPP[i] * n + k];
      if (fu == kFluid) {
        dm = dm + df;
        fluid = true;
      } else if (fu == kInterface) {
        const float w = 0.5f * (phi + fs[kPhi][up(i, x, y, z)]);
        dm = dm + w * df;
      }
      gas = gas || fu == kGas;
    }
    t.dm[k] = dm;
    t.gas[k] = gas;
    t.fluid[k] = fluid;
    if (!gas) return;
    const float rho_gas = 1.0f - p.gas_factor * fs[kKappa][c];
    const float rho0 = s0 + 1.0f;
    float u0[3], feq[Q];
    for (int a = 0; a < D; ++a) u0[a] = j0[a] / rho0;
    equilibrium(rho_gas, u0, feq);
    for (int i = 1; i < Q; ++i)
      if (t.fl[i * n + k] == kGas)
        t.in[i * n + k] = feq[i] + feq[L::OPP[i]] - t.own[L::OPP[i] * n + k];
  }

  // The liquid lanes of cells k .. k + 7 (their own flags in kind[k ..]): an
  // all-ones mask where the flag is `v` or `w`.
  static __m256 is8(const uint8_t* kind, uint8_t v, uint8_t w) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kind));
    const __m128i m = _mm_or_si128(_mm_cmpeq_epi8(b, _mm_set1_epi8(v)),
                                   _mm_cmpeq_epi8(b, _mm_set1_epi8(w)));
    return _mm256_castsi256_ps(_mm256_cvtepi8_epi32(m));
  }

  // Direction i of the cells k .. (8 or 1 of them): bounce-back from solid
  // neighbours and the exchanged mass of fluid cells (weight 1 towards liquid).
  void links(Tile& t, int n) const {
    for (int i = 1; i < Q; ++i) {
      float* in = t.in.data() + i * n;
      const float* opp = t.own.data() + L::OPP[i] * n;
      const uint8_t* fu = t.fl.data() + i * n;
      float* dm = t.dm.data();
      int k = 0;
      for (; k + 8 <= n; k += 8) {
        const __m256 a = _mm256_loadu_ps(in + k), b = _mm256_loadu_ps(opp + k);
        const __m256 w = is8(fu + k, kFluid, kInterface);
        const __m256 d = _mm256_and_ps(w, _mm256_sub_ps(a, b));
        _mm256_storeu_ps(dm + k, _mm256_add_ps(_mm256_loadu_ps(dm + k), d));
        _mm256_storeu_ps(in + k, _mm256_blendv_ps(a, b, is8(fu + k, kSolid, kSolid)));
      }
      for (; k < n; ++k) {
        const bool w = fu[k] == kFluid || fu[k] == kInterface;
        dm[k] = dm[k] + (w ? in[k] - opp[k] : 0.0f);
        in[k] = fu[k] == kSolid ? opp[k] : in[k];
      }
    }
  }

  // The cells (x, y0 .. y0 + ty - 1, z0 .. z0 + tz - 1): their new populations
  // into the plane buffer `out` (layout (Q, Y, Z)), their mass exchange, work
  // bytes and conversion marks.
  void tile(Tile& t, int x, int y0, int ty, int z0, int tz, const T* const* source) {
    const int n = ty * tz;
    t.x = x, t.y0 = y0, t.ty = ty, t.z0 = z0, t.tz = tz;
    uint8_t* kind = t.kind.data();  // the box holds liquid (liquid_tile)
    for (int r = 0; r < ty; ++r) std::memcpy(kind + r * tz, flags + cell(x, y0 + r, z0), tz);
    for (int i = 0; i < Q; ++i) {
      const int xs = wrap(x - cx(i), nx);
      for (int r = 0; r < ty; ++r) {
        const int y = y0 + r;
        float* in = t.in.data() + i * n + r * tz;
        pull(source[i], nz, i, x, y, z0, tz, in,
             [](const T* s, float* d, int m) { decode<S>(s, d, m); });
        pull(flags + cell(xs, 0, 0), nz, i, x, y, z0, tz, t.fl.data() + i * n + r * tz,
             [](const int8_t* s, uint8_t* d, int m) { std::memcpy(d, s, m); });
        decode<S>(f + pop(i, x, y, z0), t.own.data() + i * n + r * tz, tz);
      }
    }
    std::fill(t.dm.begin(), t.dm.begin() + n, 0.0f);
    links(t, n);
    for (int r = 0; r < ty; ++r) {
      if (!(row[x * ny + y0 + r] & kRowI)) continue;
      for (int z = 0; z < tz; ++z)
        if (kind[r * tz + z] == kInterface)
          interface_cell(t, n, r * tz + z, x, y0 + r, z0 + z);
    }
    for (int r = 0; r < ty; ++r) {  // mass += dm in the liquid (compensated)
      float* m = mass + cell(x, y0 + r, z0);
      float* e = carry + cell(x, y0 + r, z0);
      const float* dm = t.dm.data() + r * tz;
      const uint8_t* fl = kind + r * tz;
      int z = 0;
      for (; z + 8 <= tz; z += 8) {
        const __m256 a = _mm256_loadu_ps(m + z), b = _mm256_loadu_ps(dm + z);
        const __m256 total = _mm256_add_ps(a, b), back = _mm256_sub_ps(total, a);
        const __m256 err = _mm256_add_ps(_mm256_sub_ps(a, _mm256_sub_ps(total, back)),
                                         _mm256_sub_ps(b, back));
        const __m256 liquid = is8(fl + z, kFluid, kInterface);
        const __m256 c = _mm256_loadu_ps(e + z);
        _mm256_storeu_ps(m + z, _mm256_blendv_ps(a, total, liquid));
        _mm256_storeu_ps(e + z, _mm256_blendv_ps(c, _mm256_add_ps(c, err), liquid));
      }
      for (; z < tz; ++z)
        if (fl[z] == kInterface || fl[z] == kFluid) two_sum(m[z], e[z], dm[z]);
    }
    int k = 0;
    if (p.gravity) {
      for (; k + 8 <= n; k += 8) collide<Avx, true>(t.in.data(), n, k, t.rho.data(), t.u.data());
      for (; k < n; ++k) collide<Scalar, true>(t.in.data(), n, k, t.rho.data(), t.u.data());
    } else {
      for (; k + 8 <= n; k += 8) collide<Avx, false>(t.in.data(), n, k, t.rho.data(), t.u.data());
      for (; k < n; ++k) collide<Scalar, false>(t.in.data(), n, k, t.rho.data(), t.u.data());
    }
    for (int r = 0; r < ty; ++r) {  // the marks (liquid_tile copied the old flags)
      const int y = y0 + r;
      uint8_t* w = work + cell(x, y, z0);
      if (!(row[x * ny + y] & kRowI)) continue;
      for (int z = 0; z < tz; ++z) {
        const int k = r * tz + z;
        if (kind[k] != kInterface) continue;
        const size_t c = cell(x, y, z0 + z);
        const float rho = t.rho[k], m = mass[c];
        fs[kRho][c] = rho;
        for (int a = 0; a < D; ++a) fs[kU0 + a][c] = t.u[a * n + k];
        const bool to_fluid = m > p.fill_limit * rho || !t.gas[k];
        const bool to_gas = !to_fluid && (m < 0.0f || !t.fluid[k]);
        w[z] |= (to_fluid ? kToFluid : 0) | (to_gas ? kToGas : 0);
        if (to_fluid || to_gas)
          __atomic_fetch_or(row + x * ny + y, to_fluid ? kRowToFluid : kRowToGas,
                            __ATOMIC_RELAXED);
      }
    }
  }

  // Stores the populations of the box tile() computed last into g (gas and
  // solid cells among them: the rest populations).
  void store(Tile& t) {
    const int n = t.ty * t.tz;
    const uint8_t* kind = t.kind.data();
    for (int i = 0; i < Q; ++i) {
      float* in = t.in.data() + i * n;
      const __m256 rest8 = _mm256_set1_ps(rest[i]);
      int k = 0;
      for (; k + 8 <= n; k += 8)
        _mm256_storeu_ps(in + k, _mm256_blendv_ps(rest8, _mm256_loadu_ps(in + k),
                                                  is8(kind + k, kFluid, kInterface)));
      for (; k < n; ++k)
        if (kind[k] != kFluid && kind[k] != kInterface) in[k] = rest[i];
      for (int r = 0; r < t.ty; ++r)
        encode<S>(in + r * t.tz, g + pop(i, t.x, t.y0 + r, t.z0), t.tz);
    }
    t.tz = 0;
  }

  // The tile (x, y0 .. y0 + ty - 1, z0 .. z0 + tz - 1) narrowed to the z range
  // of its rows' liquid cells (the cells outside it are gas or solid and hold
  // the rest populations already: they keep them), into t (t.tz = 0: no
  // liquid, nothing to store). Every cell's work byte is its flag.
  void liquid_tile(Tile& t, int x, int y0, int ty, int z0, int tz,
                   const T* const* source) {
    int a = z0 + tz, b = z0;
    for (int r = 0; r < ty; ++r) {
      const int s = x * ny + y0 + r;
      std::memcpy(work + cell(x, y0 + r, z0), flags + cell(x, y0 + r, z0), tz);
      a = std::min(a, std::max(llo[s], z0)), b = std::max(b, std::min(lhi[s], z0 + tz));
    }
    t.tz = 0;
    if (a < b) tile(t, x, y0, ty, a, b - a, source);
  }

  // The directions leaving an x-plane upwards (c_x = 1) and downwards.
  struct Across {
    int up[Q], down[Q], n = 0;  // n of each
    int slot[Q];                // direction i's place in up or down
    Across() {
      int d = 0;
      for (int i = 0; i < Q; ++i) {
        if (cx(i) == 1) slot[i] = n, up[n++] = i;
        if (cx(i) == -1) slot[i] = d, down[d++] = i;
      }
    }
  };

  // Copies the slices (Y, Z) of x-plane x of the directions `dirs` into buf.
  void save(int x, const int* dirs, int count, T* buf) const {
    const size_t slice = static_cast<size_t>(ny) * nz;
    for (int j = 0; j < count; ++j)
      std::memcpy(buf + j * slice, f + x * plane + dirs[j] * slice, slice * sizeof(T));
  }

  // Stream-collide in place. The x-planes are split into `chunks` runs of
  // consecutive planes, each computed in order; a plane's tiles are computed
  // in rows of tiles and a row is stored once the next row is computed (the
  // first row last: the last pulls from it). What the old values are still
  // needed for after that is copied first into `saved` (4 buffers of the
  // planes' slices of the directions crossing an x-plane, per run): of every
  // plane, its upward slices (the next plane pulls them); of a run's first and
  // last planes, the slices the neighbouring runs pull (copied before any run
  // starts). Only the liquid's z range of each tile is computed and stored:
  // gas and solid cells hold the rest populations already (the step and
  // FreeSurface.init leave them so).
  void run(int threads, int chunks, T* saved, bool poison) {
    if (poison)  // a check: a scratch value read before it is written spreads NaN
      std::fill(fs[0], fs[0] + kFloats * cells, std::numeric_limits<float>::quiet_NaN());
    const float zero[3] = {0.0f, 0.0f, 0.0f};
    equilibrium(1.0f, zero, rest);
    int axes[3] = {0, 1, 2}, n_axes = 3;
    if (D == 2) axes[1] = 2, n_axes = 2;
    const int ty = nz >= kTileCells ? 1 : (ny < kTileCells / nz ? ny : kTileCells / nz);
    const int tz = nz > kTileCells ? kTileCells : nz;
    const int tiles_y = (ny + ty - 1) / ty, tiles_z = (nz + tz - 1) / tz;
    const Across across;
    const size_t part = static_cast<size_t>(across.n) * ny * nz;  // one buffer
    auto buffer = [&](int c, int k) { return saved + (static_cast<size_t>(c) * 4 + k) * part; };
    auto first = [&](int c) { return static_cast<int>(static_cast<int64_t>(c) * nx / chunks); };
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
    {
      fill_pass();
      ranges();
      curvature_fields(axes, n_axes);
      curvature_pass(axes, n_axes);
      // the rows of tiles: the first (stored last), the previous and this one
      std::vector<Tile> held, last, now;
      for (int k = 0; k < tiles_z; ++k)
        held.emplace_back(ty * tz), last.emplace_back(ty * tz), now.emplace_back(ty * tz);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {  // buffer 0: first plane's downward slices
        save(first(c), across.down, across.n, buffer(c, 0));
        save(first(c + 1) - 1, across.up, across.n, buffer(c, 1));  // 1: last's upward
      }
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const int x0 = first(c), x1 = first(c + 1);
        const int before = (c + chunks - 1) % chunks, after = (c + 1) % chunks;
        for (int x = x0; x < x1; ++x) {
          const size_t slice = static_cast<size_t>(ny) * nz;
          const T* source[Q];
          for (int i = 0; i < Q; ++i) {
            const int s = across.slot[i];
            if (cx(i) == 0) {
              source[i] = f + x * plane + i * slice;
            } else if (cx(i) == 1) {  // from plane x - 1, stored already
              source[i] = (x == x0 ? buffer(before, 1) : buffer(c, 2 + (x - 1) % 2)) + s * slice;
            } else {  // from plane x + 1, not yet stored unless it starts the next run
              source[i] = x + 1 == x1 ? buffer(after, 0) + s * slice
                                      : f + wrap(x + 1, nx) * plane + i * slice;
            }
          }
          if (x + 1 < x1) save(x, across.up, across.n, buffer(c, 2 + x % 2));
          for (int r = 0; r < tiles_y; ++r) {
            std::vector<Tile>& row_tiles = r == 0 ? held : now;
            for (int k = 0; k < tiles_z; ++k) {
              const int y0 = r * ty, z0 = k * tz;
              liquid_tile(row_tiles[k], x, y0, std::min(ty, ny - y0), z0,
                          std::min(tz, nz - z0), source);
            }
            if (r >= 2)
              for (Tile& done : last) if (done.tz > 0) store(done);
            if (r >= 1) std::swap(last, now);
          }
          for (Tile& done : last) if (done.tz > 0) store(done);  // the last row
          for (Tile& done : held) if (done.tz > 0) store(done);  // the first row
        }
      }
      convert_pass();
      share_pass();
      gather_pass();
    }
  }

  // Runs of x-planes the stream-collide pass splits the grid into (one per
  // thread, at most one per plane); lbm_jax.step._native.free_surface_chunks.
  static int chunks(int64_t threads, int nx) {
    return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, nx)));
  }

  static ffi::Error call(ffi::AnyBuffer f_in, ffi::AnyBuffer flags_in,
                         ffi::AnyBuffer mass_in, ffi::AnyBuffer carry_in,
                         ffi::Result<ffi::AnyBuffer> g_out,
                         ffi::Result<ffi::AnyBuffer> flags_out,
                         ffi::Result<ffi::AnyBuffer> mass_out,
                         ffi::Result<ffi::AnyBuffer> carry_out,
                         ffi::Result<ffi::AnyBuffer> floats,
                         ffi::Result<ffi::AnyBuffer> bytes,
                         ffi::Result<ffi::AnyBuffer> ints,
                         ffi::Result<ffi::AnyBuffer> saved, float omega, float cp,
                         float cm, float fill_limit, float gas_factor,
                         ffi::Span<const float> gravity, float omega_minus,
                         float tau, float magic, float smagorinsky_c2, int64_t trt,
                         int64_t passes, int64_t threads, int64_t poison) {
    (void)flags_in, (void)mass_in, (void)carry_in;  // aliased with the results
    // f_in and g_out alias too: the step runs in place
    auto dims = f_in.dimensions();
    if (f_in.element_type() != S::kType || g_out->element_type() != S::kType ||
        dims.size() != static_cast<size_t>(D) + 1 || dims[1] != Q)
      return ffi::Error::InvalidArgument(
          "lbm_free_surface: populations have the wrong dtype or shape");
    FreeSurfaceStep s;
    s.nx = static_cast<int>(dims[0]);
    s.ny = D == 3 ? static_cast<int>(dims[2]) : 1;
    s.nz = static_cast<int>(dims[D]);
    s.rows = s.nx * s.ny;
    s.cells = static_cast<size_t>(s.rows) * s.nz;
    s.plane = static_cast<size_t>(Q) * s.ny * s.nz;
    if (flags_out->element_type() != ffi::DataType::S8 ||
        mass_out->element_type() != ffi::DataType::F32 ||
        carry_out->element_type() != ffi::DataType::F32 ||
        flags_out->element_count() != s.cells || mass_out->element_count() != s.cells ||
        carry_out->element_count() != s.cells ||
        floats->element_count() != kFloats * s.cells ||
        bytes->element_count() != s.cells + 2 * static_cast<size_t>(s.rows) ||
        ints->element_count() != (4 + 3 * kRanges) * static_cast<size_t>(s.rows) ||
        gravity.size() != static_cast<size_t>(D) || passes < 0 ||
        f_in.untyped_data() != g_out->untyped_data() ||
        saved->element_type() != S::kType ||
        saved->element_count() !=
            4 * static_cast<size_t>(Across().n) * s.ny * s.nz * chunks(threads, s.nx))
      return ffi::Error::InvalidArgument(
          "lbm_free_surface: flags (int8), mass, carry (float32) or scratch arrays "
          "have the wrong dtype or size, or the populations are not aliased");
    s.p = Params{omega, cp, cm, fill_limit, gas_factor, {0.0f, 0.0f, 0.0f},
                 static_cast<int>(passes), false};
    s.p.omega_minus = omega_minus, s.p.tau = tau, s.p.magic = magic, s.p.c2 = smagorinsky_c2;
    s.p.trt = trt != 0, s.p.smagorinsky = smagorinsky_c2 > 0.0f;
    for (int a = 0; a < D; ++a) {
      s.p.g[a] = gravity.begin()[a];
      s.p.gravity = s.p.gravity || s.p.g[a] != 0.0f;
    }
    s.f = static_cast<const T*>(f_in.untyped_data());
    s.g = static_cast<T*>(g_out->untyped_data());
    s.flags = static_cast<int8_t*>(flags_out->untyped_data());
    s.mass = static_cast<float*>(mass_out->untyped_data());
    s.carry = static_cast<float*>(carry_out->untyped_data());
    float* fp = static_cast<float*>(floats->untyped_data());
    for (int k = 0; k < kFloats; ++k) s.fs[k] = fp + k * s.cells;
    s.work = static_cast<uint8_t*>(bytes->untyped_data());
    s.row = s.work + s.cells;
    s.row2 = s.row + s.rows;
    int32_t* ip = static_cast<int32_t*>(ints->untyped_data());
    s.lo = ip, s.hi = ip + s.rows, s.llo = ip + 2 * s.rows, s.lhi = ip + 3 * s.rows;
    for (int k = 0; k < kRanges; ++k) {
      s.rlo[k] = ip + (4 + 3 * k) * s.rows, s.rhi[k] = ip + (5 + 3 * k) * s.rows;
      s.roff[k] = ip + (6 + 3 * k) * s.rows;
    }
    s.run(static_cast<int>(threads), chunks(threads, s.nx),
          static_cast<T*>(saved->untyped_data()), poison != 0);
    return ffi::Error::Success();
  }
};

}  // namespace

#define LBM_FS_DEFINE(LAT, STORE, NAME)                                      \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(NAME, (FreeSurfaceStep<LAT, STORE>::call),   \
                                ffi::Ffi::Bind()                             \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Arg<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Ret<ffi::AnyBuffer>()                   \
                                    .Attr<float>("omega")                    \
                                    .Attr<float>("cp")                       \
                                    .Attr<float>("cm")                       \
                                    .Attr<float>("fill_limit")               \
                                    .Attr<float>("gas_factor")               \
                                    .Attr<ffi::Span<const float>>("gravity") \
                                    .Attr<float>("omega_minus")              \
                                    .Attr<float>("tau")                      \
                                    .Attr<float>("magic")                    \
                                    .Attr<float>("smagorinsky_c2")           \
                                    .Attr<int64_t>("trt")                    \
                                    .Attr<int64_t>("passes")                 \
                                    .Attr<int64_t>("threads")                \
                                    .Attr<int64_t>("poison"));

LBM_FS_DEFINE(D2Q9, Fp32, lbm_free_surface_D2Q9_fp32)
LBM_FS_DEFINE(D2Q9, Fp16s, lbm_free_surface_D2Q9_fp16s)
LBM_FS_DEFINE(D2Q9, Bf16, lbm_free_surface_D2Q9_bf16)
LBM_FS_DEFINE(D2Q9, Fp16c, lbm_free_surface_D2Q9_fp16c)
LBM_FS_DEFINE(D3Q19, Fp32, lbm_free_surface_D3Q19_fp32)
LBM_FS_DEFINE(D3Q19, Fp16s, lbm_free_surface_D3Q19_fp16s)
LBM_FS_DEFINE(D3Q19, Bf16, lbm_free_surface_D3Q19_bf16)
LBM_FS_DEFINE(D3Q19, Fp16c, lbm_free_surface_D3Q19_fp16c)
LBM_FS_DEFINE(D3Q27, Fp32, lbm_free_surface_D3Q27_fp32)
LBM_FS_DEFINE(D3Q27, Fp16s, lbm_free_surface_D3Q27_fp16s)
LBM_FS_DEFINE(D3Q27, Bf16, lbm_free_surface_D3Q27_bf16)
LBM_FS_DEFINE(D3Q27, Fp16c, lbm_free_surface_D3Q27_fp16c)
