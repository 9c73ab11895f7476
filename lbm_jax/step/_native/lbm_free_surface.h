// The free-surface step's grid, fields and surface passes (see
// lbm_free_surface.cc for the step and the order of its passes): the fill
// level (pass 0), the curvature fields near the interface (C), and the
// conversions, excess sharing and gathering (passes 2-4). Internal to the
// native library; lbm_free_surface.cc includes it once.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "lbm_codecs.h"

namespace lbm_native {

constexpr int kTileCells = 512;
// lbm_jax.free_surface.Flag
constexpr uint8_t kGas = 0, kInterface = 1, kFluid = 2, kSolid = 3;
// the per-cell work byte: old flag, conversion marks, excess-sharing state
constexpr uint8_t kFlag = 3, kToFluid = 4, kToGas = 8, kShares = 16, kKeeps = 32;
// the per-row summary
constexpr uint8_t kRowI = 1, kRowLiquid = 2, kRowToFluid = 4, kRowToGas = 8;
// float scratch arrays (each one value per cell)
enum { kPhi, kA, kB, kG0, kG1, kG2, kRho, kU0, kU1, kU2, kExcess, kShare, kFloats };
// the curvature's intermediate fields, in arrays that passes 1-2 fill only later
enum { kZs = kB, kZd = kExcess, kY1 = kRho, kY2 = kU0, kY3 = kU1, kKappa = kA };
// per-row z ranges: the outputs of the curvature's x, y and z passes, the fill
// they start from, and a temporary; an empty range is (kEmptyLo, kEmptyHi)
enum { kRx, kRy, kRz, kRa, kRt, kRanges };
constexpr int kEmptyLo = 1 << 29, kEmptyHi = -(1 << 29);

struct Params {
  float omega, cp, cm, fill_limit, gas_factor;  // gas_factor: 3 (D - 1) sigma
  float g[3];
  int passes;
  bool gravity;
  // TRT (omega_minus, magic) and the Smagorinsky model (c2 = 18 sqrt(2) C^2)
  float omega_minus, tau, magic, c2;
  bool trt, smagorinsky;
};

inline int wrap(int v, int n) { return v < 0 ? v + n : v >= n ? v - n : v; }

inline void two_sum(float& mass, float& carry, float add) {
  const float total = mass + add;
  const float b = total - mass;
  const float err = (mass - (total - b)) + (add - b);
  mass = total;
  carry = carry + err;
}


// out[z] = sum_j k[j] in_j[z], z0 <= z < z1, for the w rows in_j (w = W when
// W > 0: the taps unrolled, the cells vectorised). One copy for every lattice
// and storage (not inlined: it runs once per row).
template <int W>
__attribute__((noinline)) void row_sum(const float* const* in, const float* k, int w,
                                       float* out, int z0, int z1) {
  const int taps = W > 0 ? W : w;
  for (int z = z0; z < z1; ++z) {
    float sum = k[0] * in[0][z];
    for (int j = 1; j < taps; ++j) sum = sum + k[j] * in[j][z];
    out[z] = sum;
  }
}
inline void row_sum(const float* const* in, const float* k, int w, float* out, int z0,
                    int z1) {
  switch (w) {  // smoothing 0 to 3 passes
    case 3: return row_sum<3>(in, k, w, out, z0, z1);
    case 5: return row_sum<5>(in, k, w, out, z0, z1);
    case 7: return row_sum<7>(in, k, w, out, z0, z1);
    case 9: return row_sum<9>(in, k, w, out, z0, z1);
    default: return row_sum<0>(in, k, w, out, z0, z1);
  }
}

template <class L, class S>
struct FreeSurfaceGrid {
  using T = typename S::T;
  static constexpr int Q = L::Q;
  static constexpr int D = L::D;
  static constexpr int cx(int i) { return L::C[i][0]; }
  static constexpr int cy(int i) { return D == 3 ? L::C[i][1] : 0; }
  static constexpr int cz(int i) { return L::C[i][D - 1]; }

  int nx, ny, nz, rows;
  size_t cells, plane;  // plane: Q ny nz populations
  Params p;
  const T* f;
  T* g;
  int8_t* flags;
  float *mass, *carry, *fs[kFloats];
  uint8_t *work, *row, *row2;
  // per row: the z ranges of the interface and liquid cells, and of the
  // curvature passes (see ranges())
  int32_t *lo, *hi, *llo, *lhi, *rlo[kRanges], *rhi[kRanges], *roff[kRanges];
  float rest[Q];

  size_t cell(int x, int y, int z) const {
    return (static_cast<size_t>(x) * ny + y) * nz + z;
  }
  size_t pop(int i, int x, int y, int z) const {
    return x * plane + (static_cast<size_t>(i) * ny + y) * nz + z;
  }
  // the upstream neighbour x - c_i of cell (x, y, z)
  size_t up(int i, int x, int y, int z) const {
    return cell(wrap(x - cx(i), nx), wrap(y - cy(i), ny), wrap(z - cz(i), nz));
  }
  float fill(size_t c) const {
    const int8_t fl = flags[c];
    return fl == kFluid ? 1.0f : fl == kInterface ? fs[kPhi][c] : 0.0f;
  }

  // The shifted equilibrium, as lbm_jax.core._collision.equilibrium orders it.
  static void equilibrium(float r, const float* u, float* feq) {
    float usq = 0.0f;
    for (int a = 0; a < D; ++a) usq = usq + u[a] * u[a];
    for (int i = 0; i < Q; ++i) {
      float cu = 0.0f;
      for (int a = 0; a < D; ++a) cu = cu + static_cast<float>(L::C[i][a]) * u[a];
      const float poly = 3.0f * cu + 4.5f * (cu * cu) - 1.5f * usq;
      feq[i] = L::W[i] * r * poly + L::W[i] * (r - 1.0f);
    }
  }

  // ------------------------------------------------------------ pass 0: fill
  // The fill level of the interface cells of row (x, y) from z, whose flags are
  // q[0 ..]: `mask` marks them (bit b: cell z + b).
  void fill_cells(int x, int y, int z, uint32_t mask) {
    for (; mask; mask &= mask - 1) {
      const int zi = z + __builtin_ctz(mask);
      const size_t c = cell(x, y, zi);
      float s = 0.0f;
      for (int i = 0; i < Q; ++i) s = s + S::load1(f + pop(i, x, y, zi));
      const float phi = mass[c] / (s + 1.0f);
      fs[kPhi][c] = std::min(std::max(phi, 0.0f), 1.0f);
    }
  }

  // Per row: the z ranges of its interface and liquid cells and their summary
  // bits, and the interface cells' fill levels. The flags are scanned 32 at a
  // time.
  void fill_pass() {
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const int x = r / ny, y = r % ny;
      const int8_t* q = flags + cell(x, y, 0);
      int first = nz, last = -1, wet = nz, dry = 0;
      auto note = [&](int z, uint32_t fluid, uint32_t iface) {
        const uint32_t liquid = fluid | iface;
        if (liquid) {
          wet = std::min(wet, z + __builtin_ctz(liquid));
          dry = std::max(dry, z + 32 - __builtin_clz(liquid));
        }
        if (iface) {
          first = std::min(first, z + __builtin_ctz(iface));
          last = std::max(last, z + 31 - __builtin_clz(iface));
          fill_cells(x, y, z, iface);
        }
      };
      int z = 0;
      for (; z + 32 <= nz; z += 32) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + z));
        note(z, _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(kFluid))),
             _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(kInterface))));
      }
      for (; z < nz; ++z) note(z, q[z] == kFluid, q[z] == kInterface);
      row[r] = (wet < dry ? kRowLiquid : 0) | (first <= last ? kRowI : 0);
      lo[r] = first;
      hi[r] = last + 1;
      llo[r] = wet;
      lhi[r] = dry;
    }
  }

  // The hull of the ranges (from_lo, from_hi) over the rows within `radius`
  // along axis 0 (x) or 1 (y), widened by `grow` along z, into range `to`; a
  // range leaving the row becomes the whole (periodic) row.
  void window(const int32_t* from_lo, const int32_t* from_hi, int to, int axis, int radius,
              int grow) {
    radius = std::min(radius, ((axis == 0 ? nx : ny) - 1) / 2);
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const int x = r / ny, y = r % ny;
      int a = kEmptyLo, b = kEmptyHi;
      for (int d = -radius; d <= radius; ++d) {
        const int s = axis == 0 ? wrap(x + d, nx) * ny + y : x * ny + wrap(y + d, ny);
        a = std::min(a, from_lo[s]), b = std::max(b, from_hi[s]);
      }
      if (a < b) {
        a = a - grow, b = b + grow;
        if (a < 0 || b > nz) a = 0, b = nz;
      } else {
        a = kEmptyLo, b = kEmptyHi;
      }
      rlo[to][r] = a, rhi[to][r] = b;
    }
  }

  // The z ranges each curvature pass computes, working back from what the
  // interface cells read: the normals (x pass) within one cell of an interface
  // cell (also where conversions happen: passes 2-4 visit it), the y pass's
  // output wherever the x pass's kernel reaches (h = passes + 1 rows along x),
  // the z pass's wherever the y pass's does (h rows along y), the fill h cells
  // beyond along z. (An interface-free row: lo = nz, hi = 0.)
  void ranges() {
    const int h = p.passes + 1;
    window(lo, hi, kRt, 1, D == 3 ? 1 : 0, 1);
    window(rlo[kRt], rhi[kRt], kRx, 0, 1, 0);
    window(rlo[kRx], rhi[kRx], kRy, 0, h, 0);
    window(rlo[kRy], rhi[kRy], kRz, 1, D == 3 ? h : 0, 0);
    window(rlo[kRz], rhi[kRz], kRa, 1, 0, h);
#pragma omp single
    for (int k : {kRx, kRy, kRz, kRa}) {  // the fields are stored range by range
      int32_t total = 0;
      for (int r = 0; r < rows; ++r) {
        roff[k][r] = total;
        total += std::max(rhi[k][r] - rlo[k][r], 0);
      }
    }
  }

  // Row r of a field stored compactly over range k: element z at row(k, f, r)[z].
  float* row_of(int k, float* field, int r) const {
    return field + (static_cast<ptrdiff_t>(roff[k][r]) - rlo[k][r]);
  }

  static int mod(int v, int n) {
    v %= n;
    return v < 0 ? v + n : v;
  }

  // The smoothed gradient (lbm_jax.free_surface.curvature, "smoothed": the
  // fill smoothed `passes` times by s = (1/4, 1/2, 1/4) along every axis, the
  // central difference d = (-1/2, 0, 1/2) along axis k, then s along the other
  // axes) is separable: d s^passes along k, s^(passes + 1) along the others,
  // kernels 2 h + 1 wide, h = passes + 1. Into `smooth` and `diff`, exact.
  void kernels(float* smooth, float* diff) const {
    const int h = p.passes + 1;
    std::vector<double> b(1, 1.0);  // s^(h - 1), 2 h - 1 wide
    for (int q = 0; q + 1 < h; ++q) {
      std::vector<double> c(b.size() + 2, 0.0);
      for (size_t j = 0; j < b.size(); ++j)
        c[j] += 0.25 * b[j], c[j + 1] += 0.5 * b[j], c[j + 2] += 0.25 * b[j];
      b.swap(c);
    }
    for (int j = 0; j < 2 * h + 1; ++j) {
      const double at = j < 2 * h - 1 ? b[j] : 0.0, before = j >= 2 ? b[j - 2] : 0.0;
      const double mid = j >= 1 && j < 2 * h ? b[j - 1] : 0.0;
      smooth[j] = static_cast<float>(0.25 * at + 0.5 * mid + 0.25 * before);
      diff[j] = static_cast<float>(0.5 * (before - at));
    }
  }

  // The unit normals of the smoothed fill field near the interface, fs[kG0 + k]
  // along the k-th of the axes: three passes (z, y, x; 2D lattices: z, x), each
  // over its ranges (ranges()), every field stored compactly over its range
  // (row_of), the intermediate ones in arrays the later passes fill only
  // afterwards.
  void curvature_fields(const int axes[3], int n_axes) {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {  // solid cells: mean fill of their neighbours
      const int x = r / ny, y = r % ny;
      float* a = row_of(kRa, fs[kA], r);
      for (int z = rlo[kRa][r]; z < rhi[kRa][r]; ++z) {
        const size_t c = cell(x, y, z);
        if (flags[c] != kSolid) {
          a[z] = fill(c);
          continue;
        }
        float total = 0.0f, count = 0.0f;
        for (int k = 0; k < n_axes; ++k)
          for (int s : {1, -1}) {
            int q[3] = {x, y, z};
            const int n[3] = {nx, ny, nz};
            q[axes[k]] = wrap(q[axes[k]] - s, n[axes[k]]);
            const size_t nb = cell(q[0], q[1], q[2]);
            const bool open = flags[nb] != kSolid;
            total = total + (open ? fill(nb) : 0.0f);
            count = count + (open ? 1.0f : 0.0f);
          }
        a[z] = total / std::max(count, 1.0f);
      }
    }
    const int h = p.passes + 1, w = 2 * h + 1;
    std::vector<float> ks(w), kd(w), line(nz + 2 * h);
    std::vector<const float*> in(w);
    kernels(ks.data(), kd.data());
    // z: both kernels on a wrapped copy of the row
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      const int z0 = rlo[kRz][r], z1 = rhi[kRz][r];
      if (z0 >= z1) continue;
      const float* a = row_of(kRa, fs[kA], r);
      if (h < nz) {
        for (int z = z0 - h; z < z1 + h; ++z) line[z - z0 + h] = a[wrap(z, nz)];
      } else {
        for (int z = z0 - h; z < z1 + h; ++z) line[z - z0 + h] = a[mod(z, nz)];
      }
      for (int j = 0; j < w; ++j) in[j] = line.data() + j - z0;
      row_sum(in.data(), ks.data(), w, row_of(kRz, fs[kZs], r), z0, z1);
      row_sum(in.data(), kd.data(), w, row_of(kRz, fs[kZd], r), z0, z1);
    }
    // y (3D): s along y of both, d along y of the smoothed one
    if (D == 3) {
#pragma omp for schedule(dynamic, 16)
      for (int r = 0; r < rows; ++r) {
        const int z0 = rlo[kRy][r], z1 = rhi[kRy][r];
        if (z0 >= z1) continue;
        const int x = r / ny, y = r % ny;
        for (int j = 0; j < w; ++j) in[j] = row_of(kRz, fs[kZs], x * ny + mod(y + j - h, ny));
        row_sum(in.data(), ks.data(), w, row_of(kRy, fs[kY1], r), z0, z1);
        row_sum(in.data(), kd.data(), w, row_of(kRy, fs[kY2], r), z0, z1);
        for (int j = 0; j < w; ++j) in[j] = row_of(kRz, fs[kZd], x * ny + mod(y + j - h, ny));
        row_sum(in.data(), ks.data(), w, row_of(kRy, fs[kY3], r), z0, z1);
      }
    }
    // x: the gradient, then normalised
    float* src[3] = {D == 3 ? fs[kY1] : fs[kZs], fs[kY2], D == 3 ? fs[kY3] : fs[kZd]};
    const int which[3] = {0, D == 3 ? 1 : 2, 2};  // grad[k] from src[which[k]]
    const int by = D == 3 ? kRy : kRz;              // their ranges
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      const int z0 = rlo[kRx][r], z1 = rhi[kRx][r];
      if (z0 >= z1) continue;
      const int x = r / ny, y = r % ny;
      for (int k = 0; k < n_axes; ++k) {
        for (int j = 0; j < w; ++j)
          in[j] = row_of(by, src[which[k]], mod(x + j - h, nx) * ny + y);
        row_sum(in.data(), k == 0 ? kd.data() : ks.data(), w, row_of(kRx, fs[kG0 + k], r),
                z0, z1);
      }
      float* __restrict g0 = row_of(kRx, fs[kG0], r);
      float* __restrict g1 = row_of(kRx, fs[kG1], r);
      float* __restrict g2 = row_of(kRx, fs[kG2], r);
      for (int z = z0; z < z1; ++z) {
        const float sq = (g0[z] * g0[z] + g1[z] * g1[z]) + (D == 3 ? g2[z] * g2[z] : 0.0f);
        const float norm = std::max(std::sqrt(sq), 1e-12f);
        g0[z] = g0[z] / norm, g1[z] = g1[z] / norm;
        if (D == 3) g2[z] = g2[z] / norm;
      }
    }
  }

  // fn(x, y, z, c) for every cell c = (x, y, z) that was an interface cell when
  // the step began (old(c): its flag then), row by row.
  template <class Old, class Fn>
  void each_interface_cell(Old old, Fn fn) {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      if (!(row[r] & kRowI)) continue;
      const int x = r / ny, y = r % ny;
      for (int z = lo[r]; z < hi[r]; ++z) {
        const size_t c = cell(x, y, z);
        if (old(c) == kInterface) fn(x, y, z, c);
      }
    }
  }

  // The curvature of every interface cell into fs[kKappa] (the fill's array,
  // free again), row by row: the normals' loads stream.
  void curvature_pass(const int axes[3], int n_axes) {
    each_interface_cell([&](size_t c) { return flags[c]; },
                        [&](int x, int y, int z, size_t c) {
                          fs[kKappa][c] = curvature(x, y, z, axes, n_axes);
                        });
  }

  // The mean curvature at interface cell (x, y, z), clamped to [-1, 1]: the
  // divergence of the normals (central differences).
  float curvature(int x, int y, int z, const int axes[3], int n_axes) const {
    float kappa = 0.0f;
    for (int k = 0; k < n_axes; ++k) {
      int lo_[3] = {x, y, z}, hi_[3] = {x, y, z};
      const int n[3] = {nx, ny, nz};
      lo_[axes[k]] = wrap(lo_[axes[k]] - 1, n[axes[k]]);
      hi_[axes[k]] = wrap(hi_[axes[k]] + 1, n[axes[k]]);
      const float dn = row_of(kRx, fs[kG0 + k], hi_[0] * ny + hi_[1])[hi_[2]] -
                       row_of(kRx, fs[kG0 + k], lo_[0] * ny + lo_[1])[lo_[2]];
      kappa = kappa + 0.5f * dn;
    }
    kappa = kappa / static_cast<float>(D - 1);
    return std::min(std::max(kappa, -1.0f), 1.0f);
  }

  // ------------------------------------------------------------ passes 2-4
  bool near_mark(int x, int y, int z, uint8_t mark) const {
    for (int i = 1; i < Q; ++i)
      if (work[up(i, x, y, z)] & mark) return true;
    return false;
  }
  bool empties(int x, int y, int z) const {  // the final to-gas mark
    return (work[cell(x, y, z)] & kToGas) && !near_mark(x, y, z, kToFluid);
  }
  bool near_rows(int x, int y, uint8_t bits) const {
    for (int dx = -1; dx <= 1; ++dx)
      for (int dy = (D == 3 ? -1 : 0); dy <= (D == 3 ? 1 : 0); ++dy)
        if (row[wrap(x + dx, nx) * ny + wrap(y + dy, ny)] & bits) return true;
    return false;
  }
  void store_cell(int x, int y, int z, const float* values) {
    for (int i = 0; i < Q; ++i) S::store1(g + pop(i, x, y, z), values[i]);
  }

  void convert_cell(int x, int y, int z) {
    const size_t c = cell(x, y, z);
    const uint8_t old = work[c] & kFlag;
    if (old == kInterface) {
      const bool to_fluid = work[c] & kToFluid;
      const bool to_gas = !to_fluid && empties(x, y, z);
      const float rho = fs[kRho][c];
      float m = mass[c], excess = to_fluid ? m - rho : to_gas ? m : 0.0f;
      if (to_fluid || to_gas) {
        excess = excess + carry[c];
        carry[c] = 0.0f;
        m = to_fluid ? rho : 0.0f;
        flags[c] = to_fluid ? kFluid : kGas;
        if (to_gas) store_cell(x, y, z, rest);
      } else {  // stays an interface cell: clamp into [0, rho]
        const float clamp = std::max(m - rho, 0.0f) + std::min(m, 0.0f);
        excess = excess + clamp;
        m = m - clamp;
      }
      mass[c] = m;
      fs[kExcess][c] = excess;
    } else if (old == kGas && near_mark(x, y, z, kToFluid)) {
      float count = 0.0f, rho = 0.0f, u[3] = {0.0f, 0.0f, 0.0f}, feq[Q];
      for (int i = 1; i < Q; ++i) {
        const int xs = wrap(x - cx(i), nx), ys = wrap(y - cy(i), ny);
        const int zs = wrap(z - cz(i), nz);
        const size_t nb = cell(xs, ys, zs);
        const uint8_t fl = work[nb] & kFlag;
        if ((fl != kInterface && fl != kFluid) || empties(xs, ys, zs)) continue;
        count = count + 1.0f;
        rho = rho + fs[kRho][nb];
        for (int a = 0; a < D; ++a) u[a] = u[a] + fs[kU0 + a][nb];
      }
      const float inv = 1.0f / std::max(count, 1.0f);
      for (int a = 0; a < D; ++a) u[a] = u[a] * inv;
      equilibrium(count > 0.0f ? rho * inv : 1.0f, u, feq);
      store_cell(x, y, z, feq);
      flags[c] = kInterface;
    } else if (old == kFluid) {
      for (int i = 1; i < Q; ++i) {
        const int xs = wrap(x - cx(i), nx), ys = wrap(y - cy(i), ny);
        if (empties(xs, ys, wrap(z - cz(i), nz))) {
          flags[c] = kInterface;
          break;
        }
      }
    }
  }

  void convert_pass() {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      const int x = r / ny, y = r % ny;
      const bool gas_may = near_rows(x, y, kRowToFluid);
      const bool fluid_may = near_rows(x, y, kRowToGas);
      row2[r] = 0;
      if (!(row[r] & kRowI) && !gas_may && !fluid_may) continue;
      // conversions happen next to interface cells: within range kRx
      for (int z = rlo[kRx][r]; z < rhi[kRx][r]; ++z) {
        const uint8_t old = work[cell(x, y, z)] & kFlag;
        if (old == kInterface || (old == kGas && gas_may) || (old == kFluid && fluid_may))
          convert_cell(x, y, z);
      }
      for (int z = rlo[kRx][r]; z < rhi[kRx][r]; ++z)
        if (flags[cell(x, y, z)] == kInterface) row2[r] = 1;
      if (row[r] & kRowI) row2[r] = 1;
    }
  }

  // The excess of interface cell c = (x, y, z) divided among its interface
  // neighbours after the conversions (kShares), or kept (kKeeps).
  void share_cell(int x, int y, int z, size_t c) {
    float targets = 0.0f;
    for (int i = 1; i < Q; ++i)
      targets = targets + (flags[up(i, x, y, z)] == kInterface ? 1.0f : 0.0f);
    fs[kShare][c] = targets > 0.0f ? fs[kExcess][c] / std::max(targets, 1.0f) : 0.0f;
    work[c] |= targets > 0.0f ? kShares : kKeeps;
  }

  void share_pass() {  // the work bytes hold the old flags since pass 1
    each_interface_cell([&](size_t c) { return work[c] & kFlag; },
                        [&](int x, int y, int z, size_t c) { share_cell(x, y, z, c); });
  }

  void gather_pass() {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      if (!row2[r]) continue;
      const int x = r / ny, y = r % ny;
      for (int z = rlo[kRx][r]; z < rhi[kRx][r]; ++z) {
        const size_t c = cell(x, y, z);
        const bool target = flags[c] == kInterface, keeps = work[c] & kKeeps;
        if (!target && !keeps) continue;
        float received = 0.0f;
        if (target)
          for (int i = 1; i < Q; ++i) {
            const size_t nb = up(i, x, y, z);
            if (work[nb] & kShares) received = received + fs[kShare][nb];
          }
        const float gained = (keeps ? fs[kExcess][c] : 0.0f) + (target ? received : 0.0f);
        two_sum(mass[c], carry[c], gained);
      }
    }
  }

};

}  // namespace lbm_native
