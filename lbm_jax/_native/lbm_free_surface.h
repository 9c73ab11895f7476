// The free-surface step's grid, fields and surface passes (see
// lbm_free_surface.cc for the step and the order of its passes): the fill
// level (pass 0), the curvature fields on the interface band (C), and the
// conversions, excess sharing and gathering (passes 2-4). Internal to the
// native library; lbm_free_surface.cc includes it once.

#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

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

struct Params {
  float omega, cp, cm, fill_limit, gas_factor;  // gas_factor: 3 (D - 1) sigma
  float g[3];
  int passes;
  bool gravity;
};

inline int wrap(int v, int n) { return v < 0 ? v + n : v >= n ? v - n : v; }

inline void two_sum(float& mass, float& carry, float add) {
  const float total = mass + add;
  const float b = total - mass;
  const float err = (mass - (total - b)) + (add - b);
  mass = total;
  carry = carry + err;
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
  float *mass, *carry, *fs[kFloats], *grad[3];
  uint8_t *work, *row, *row2;
  int32_t *lo, *hi, *blo, *bhi, *llo, *lhi;  // interface, band and liquid z ranges
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

  // The shifted equilibrium, as lbm_jax._collision.equilibrium orders it.
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
  void fill_pass() {
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const int x = r / ny, y = r % ny;
      uint8_t bits = 0;
      int first = nz, last = -1, wet = nz, dry = 0;
      for (int z = 0; z < nz; ++z) {
        const size_t c = cell(x, y, z);
        const int8_t fl = flags[c];
        if (fl == kFluid || fl == kInterface) wet = std::min(wet, z), dry = z + 1;
        if (fl == kFluid) bits |= kRowLiquid;
        if (fl != kInterface) continue;
        bits |= kRowI | kRowLiquid;
        first = std::min(first, z);
        last = z;
        float s = 0.0f;
        for (int i = 0; i < Q; ++i) s = s + S::load1(f + pop(i, x, y, z));
        const float phi = mass[c] / (s + 1.0f);
        fs[kPhi][c] = std::min(std::max(phi, 0.0f), 1.0f);
      }
      row[r] = bits;
      lo[r] = first;
      hi[r] = last + 1;
      llo[r] = wet;
      lhi[r] = dry;
    }
  }

  // ------------------------------------------------------------ C: curvature
  // The rows (and z ranges) the curvature fields are computed on: within reach
  // (the stencils' radius, margin included) of an interface cell.
  void band() {
    const int reach = p.passes + 3;
    const int ry = D == 3 ? std::min(reach, (ny - 1) / 2) : 0;
    const int rx = std::min(reach, (nx - 1) / 2);
#pragma omp for schedule(static)
    for (int r = 0; r < rows; ++r) {
      const int x = r / ny, y = r % ny;
      int first = nz, last = 0;
      for (int dx = -rx; dx <= rx; ++dx)
        for (int dy = -ry; dy <= ry; ++dy) {
          const int s = wrap(x + dx, nx) * ny + wrap(y + dy, ny);
          if (lo[s] < hi[s]) first = std::min(first, lo[s]), last = std::max(last, hi[s]);
        }
      if (first >= last) {
        blo[r] = bhi[r] = 0;
      } else if (first - reach < 1 || last + reach > nz - 1) {
        blo[r] = 0, bhi[r] = nz;  // the whole (periodic) row
      } else {
        blo[r] = first - reach, bhi[r] = last + reach;
      }
    }
  }

  // out = 0.25 (in(c - e) + in(c + e)) + 0.5 in(c) (smooth), or
  // 0.5 (in(c + e) - in(c - e)) (ddx), along axis `ax`, on the band.
  void axis_pass(const float* in, float* out, int ax, bool smooth) {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      const int z0 = blo[r], z1 = bhi[r];
      if (z0 >= z1) continue;
      const int x = r / ny, y = r % ny;
      const float* mid = in + cell(x, y, 0);
      float* o = out + cell(x, y, 0);
      if (ax == 2) {
        auto at = [&](int z, float m, float pl) {
          o[z] = smooth ? 0.25f * (m + pl) + 0.5f * mid[z] : 0.5f * (pl - m);
        };
        const int a = std::max(z0, 1), b = std::min(z1, nz - 1);
        for (int z = a; z < b; ++z) at(z, mid[z - 1], mid[z + 1]);
        if (z0 == 0) at(0, mid[nz - 1], mid[nz > 1 ? 1 : 0]);
        if (z1 == nz && nz > 1) at(nz - 1, mid[nz - 2], mid[0]);
        continue;
      }
      const float *m, *pl;
      if (ax == 0) {
        m = in + cell(wrap(x - 1, nx), y, 0), pl = in + cell(wrap(x + 1, nx), y, 0);
      } else {
        m = in + cell(x, wrap(y - 1, ny), 0), pl = in + cell(x, wrap(y + 1, ny), 0);
      }
      if (smooth) {
        for (int z = z0; z < z1; ++z) o[z] = 0.25f * (m[z] + pl[z]) + 0.5f * mid[z];
      } else {
        for (int z = z0; z < z1; ++z) o[z] = 0.5f * (pl[z] - m[z]);
      }
    }
  }

  // The gradient of the smoothed fill field (lbm_jax.free_surface.curvature,
  // "smoothed"), along the k-th of the axes into grad[k].
  void curvature_fields(int axes[3], int n_axes) {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {  // solid cells: mean fill of their neighbours
      const int x = r / ny, y = r % ny;
      for (int z = blo[r]; z < bhi[r]; ++z) {
        const size_t c = cell(x, y, z);
        if (flags[c] != kSolid) {
          fs[kA][c] = fill(c);
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
        fs[kA][c] = total / std::max(count, 1.0f);
      }
    }
    float* a = fs[kA];
    float* b = fs[kB];
    for (int pass = 0; pass < p.passes; ++pass)
      for (int k = 0; k < n_axes; ++k) {
        axis_pass(a, b, axes[k], true);
        std::swap(a, b);
      }
    float* gk[3] = {fs[kG0], fs[kG1], fs[kG2]};
    for (int k = 0; k < n_axes; ++k) axis_pass(a, gk[k], axes[k], false);
    float* tmp = b;  // every thread swaps its own pointers alike
    for (int k = 0; k < n_axes; ++k)
      for (int m = 0; m < n_axes; ++m) {
        if (m == k) continue;
        axis_pass(gk[k], tmp, axes[m], true);
        std::swap(gk[k], tmp);
      }
#pragma omp single
    for (int k = 0; k < 3; ++k) grad[k] = gk[k];
  }

  // The mean curvature at interface cell (x, y, z), clamped to [-1, 1].
  float curvature(int x, int y, int z, const int axes[3], int n_axes) const {
    auto normal = [&](size_t c, int k) {
      float sq = 0.0f;
      for (int m = 0; m < n_axes; ++m) sq = sq + grad[m][c] * grad[m][c];
      return grad[k][c] / std::max(std::sqrt(sq), 1e-12f);
    };
    float kappa = 0.0f;
    for (int k = 0; k < n_axes; ++k) {
      int lo_[3] = {x, y, z}, hi_[3] = {x, y, z};
      const int n[3] = {nx, ny, nz};
      lo_[axes[k]] = wrap(lo_[axes[k]] - 1, n[axes[k]]);
      hi_[axes[k]] = wrap(hi_[axes[k]] + 1, n[axes[k]]);
      const float dn = normal(cell(hi_[0], hi_[1], hi_[2]), k) -
                       normal(cell(lo_[0], lo_[1], lo_[2]), k);
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
      // conversions happen next to interface cells: within the band
      for (int z = blo[r]; z < bhi[r]; ++z) {
        const uint8_t old = work[cell(x, y, z)] & kFlag;
        if (old == kInterface || (old == kGas && gas_may) || (old == kFluid && fluid_may))
          convert_cell(x, y, z);
      }
      for (int z = blo[r]; z < bhi[r]; ++z)
        if (flags[cell(x, y, z)] == kInterface) row2[r] = 1;
      if (row[r] & kRowI) row2[r] = 1;
    }
  }

  void share_pass() {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      if (!(row[r] & kRowI)) continue;
      const int x = r / ny, y = r % ny;
      for (int z = lo[r]; z < hi[r]; ++z) {
        const size_t c = cell(x, y, z);
        if ((work[c] & kFlag) != kInterface) continue;
        float targets = 0.0f;
        for (int i = 1; i < Q; ++i)
          targets = targets + (flags[up(i, x, y, z)] == kInterface ? 1.0f : 0.0f);
        fs[kShare][c] = targets > 0.0f ? fs[kExcess][c] / std::max(targets, 1.0f) : 0.0f;
        work[c] |= targets > 0.0f ? kShares : kKeeps;
      }
    }
  }

  void gather_pass() {
#pragma omp for schedule(dynamic, 16)
    for (int r = 0; r < rows; ++r) {
      if (!row2[r]) continue;
      const int x = r / ny, y = r % ny;
      for (int z = blo[r]; z < bhi[r]; ++z) {
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
