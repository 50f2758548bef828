// An independent float64 re-derivation of the optimizers, written from
// docs/formulas.md with plain loops. It shares no code with the library:
// the golden tests compare both library paths against it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ref64 {

using Vec = std::vector<double>;

inline double sq_norm(const Vec& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return s;
}
inline double norm(const Vec& x) { return std::sqrt(sq_norm(x)); }
/// ||a - b||.
inline double distance(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += (a[i] - b[i]) * (a[i] - b[i]);
  return std::sqrt(s);
}

/// Per-tensor state of every optimizer (each uses what it needs).
struct State {
  Vec m;              // momentum buffer / first moment
  Vec v;              // LAMB second moment
  double vs = 0;      // NovoGrad scalar second moment
  std::int64_t t = 0; // steps taken
  Vec x;              // Schedule-Free's average
  double ws = 0;      // Schedule-Free's weight sum
  double lr_max = 0;  // Schedule-Free's largest rate so far
};

struct Lars {
  double lr = 0.1, momentum = 0.9, wd = 0, tc = 1e-3, eps = 0;
  bool nesterov = false, adapt = true;

  void step(Vec& w, const Vec& g, State& s) const {
    if (s.m.empty()) s.m.assign(w.size(), 0.0);
    const double wn = norm(w), gn = norm(g);
    const double ratio = (adapt && wn > 0 && gn > 0) ? tc * wn / (gn + wd * wn + eps) : 1.0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double d = g[i] + wd * w[i];
      s.m[i] = momentum * s.m[i] + lr * ratio * d;
      w[i] -= nesterov ? momentum * s.m[i] + lr * ratio * d : s.m[i];
    }
  }
};

struct Larc {
  double lr = 0.1, momentum = 0.9, wd = 0, tc = 0.02, eps = 1e-8;
  bool clip = true, nesterov = false, adapt = true;

  void step(Vec& w, const Vec& g, State& s) const {
    const double wn = norm(w), gn = norm(g);
    double scale = 1.0;
    if (adapt && wn > 0 && gn > 0) {
      const double local = tc * wn / (gn + wd * wn + eps);
      scale = clip ? std::min(local / lr, 1.0) : local;
    }
    Vec d(w.size());
    for (std::size_t i = 0; i < w.size(); ++i) d[i] = (g[i] + wd * w[i]) * scale;
    if (s.t == 0) {
      s.m = d;  // v = d at the first step
    } else {
      for (std::size_t i = 0; i < w.size(); ++i) s.m[i] = momentum * s.m[i] + d[i];
    }
    for (std::size_t i = 0; i < w.size(); ++i) {
      w[i] -= lr * (nesterov ? d[i] + momentum * s.m[i] : s.m[i]);
    }
    ++s.t;
  }
};

struct Lamb {
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-6, wd = 0.01;
  bool bias_correction = true, grad_averaging = true, adam_w_mode = true;
  double max_grad_norm = 0;
  bool always_adapt = false, trust_clip = false;
  double min_trust = 0, max_trust = std::numeric_limits<double>::infinity();
  bool adapt = true;

  /// One step over all tensors (global clipping needs them all).
  void step(std::vector<Vec>& ws, const std::vector<Vec>& gs, std::vector<State>& st) const {
    double G2 = 0;
    for (const auto& g : gs) G2 += sq_norm(g);
    const double divisor = max_grad_norm > 0 ? std::max(1.0, std::sqrt(G2) / max_grad_norm) : 1.0;
    for (std::size_t k = 0; k < ws.size(); ++k) {
      Vec& w = ws[k];
      State& s = st[k];
      if (s.m.empty()) { s.m.assign(w.size(), 0.0); s.v.assign(w.size(), 0.0); }
      s.t += 1;
      const double b3 = grad_averaging ? 1 - b1 : 1.0;
      const double bc1 = bias_correction ? 1 - std::pow(b1, s.t) : 1.0;
      const double bc2 = bias_correction ? 1 - std::pow(b2, s.t) : 1.0;
      Vec u(w.size());
      for (std::size_t i = 0; i < w.size(); ++i) {
        double g = gs[k][i] / divisor;
        if (!adam_w_mode) g += wd * w[i];
        s.m[i] = b1 * s.m[i] + b3 * g;
        s.v[i] = b2 * s.v[i] + (1 - b2) * g * g;
        u[i] = (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + eps) + (adam_w_mode ? wd * w[i] : 0.0);
      }
      double ratio = 1.0;
      if (adapt && (wd != 0 || always_adapt)) {
        const double wn = norm(w), un = norm(u);
        ratio = (wn > 0 && un > 0) ? wn / un : 1.0;
        ratio = std::min(std::max(ratio, min_trust), max_trust);
        if (trust_clip) ratio = std::min(ratio, 1.0);
      }
      for (std::size_t i = 0; i < w.size(); ++i) w[i] -= lr * ratio * u[i];
    }
  }
};

struct NovoGrad {
  double lr = 1e-3, b1 = 0.95, b2 = 0.98, eps = 1e-8, wd = 0;
  bool grad_averaging = false;

  void step(Vec& w, const Vec& g, State& s) const {
    if (s.m.empty()) s.m.assign(w.size(), 0.0);
    const double n = sq_norm(g);
    s.vs = s.t == 0 ? n : b2 * s.vs + (1 - b2) * n;
    ++s.t;
    for (std::size_t i = 0; i < w.size(); ++i) {
      double d = g[i] / (std::sqrt(s.vs) + eps) + wd * w[i];
      if (grad_averaging) d *= 1 - b1;
      s.m[i] = b1 * s.m[i] + d;
      w[i] -= lr * s.m[i];
    }
  }
};

struct Lion {
  double lr = 1e-4, b1 = 0.9, b2 = 0.99, wd = 0;

  void step(Vec& w, const Vec& g, State& s) const {
    if (s.m.empty()) s.m.assign(w.size(), 0.0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double c = b1 * s.m[i] + (1 - b1) * g[i];
      const double sign = c > 0 ? 1.0 : (c < 0 ? -1.0 : 0.0);
      w[i] = w[i] - lr * (sign + wd * w[i]);  // the paper's theta - lr*(sign(c) + wd*theta)
      s.m[i] = b2 * s.m[i] + (1 - b2) * g[i];
    }
    ++s.t;
  }
};

/// Schedule-Free AdamW (adaptive) or SGD in the paper's three sequences
/// (Defazio et al. 2024, Algorithm 1 with warmup and weighting): z steps,
/// x averages z, gradients are taken at y = (1-b1)*z + b1*x. State: m = z,
/// v = AdamW's second moment, x, t = steps, ws the weight sum, lr_max.
struct ScheduleFree {
  double lr = 0.0025, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0, r = 0, power = 2;
  std::int64_t warmup = 0;
  bool adaptive = true;

  /// One step: w holds y on entry and on return.
  void step(Vec& w, const Vec& g, State& s) const {
    State& e = s;
    if (s.t == 0) { s.m = w; s.v.assign(w.size(), 0.0); e.x = w; }
    ++s.t;
    const double t = static_cast<double>(s.t);
    const double rate = (s.t <= warmup) ? lr * t / static_cast<double>(warmup) : lr;
    e.lr_max = std::max(e.lr_max, rate);
    const double weight = std::pow(t, r) * std::pow(e.lr_max, power);
    e.ws += weight;
    const double c = e.ws > 0 ? weight / e.ws : 0.0;
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double y = w[i];
      double u = g[i];
      if (adaptive) {
        s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
        u = g[i] / (std::sqrt(s.v[i] / (1 - std::pow(b2, t))) + eps);
      }
      s.m[i] -= rate * (u + wd * y);                 // z
      e.x[i] = (1 - c) * e.x[i] + c * s.m[i];        // x
      w[i] = (1 - b1) * s.m[i] + b1 * e.x[i];        // y
    }
  }
};

/// A row-major rows x cols matrix.
struct Mat {
  std::size_t rows = 0, cols = 0;
  Vec x;
  double at(std::size_t i, std::size_t j) const { return x[i * cols + j]; }
};

inline Mat transpose(const Mat& a) {
  Mat t{a.cols, a.rows, Vec(a.x.size())};
  for (std::size_t i = 0; i < a.rows; ++i)
    for (std::size_t j = 0; j < a.cols; ++j) t.x[j * a.rows + i] = a.at(i, j);
  return t;
}

inline Mat matmul(const Mat& a, const Mat& b) {
  Mat c{a.rows, b.cols, Vec(a.rows * b.cols, 0.0)};
  for (std::size_t i = 0; i < a.rows; ++i)
    for (std::size_t k = 0; k < a.cols; ++k)
      for (std::size_t j = 0; j < b.cols; ++j) c.x[i * b.cols + j] += a.at(i, k) * b.at(k, j);
  return c;
}

/// Muon's Newton-Schulz iteration on one matrix (on its wide orientation).
inline Mat newton_schulz(Mat x, double a, double b, double c, int steps, double eps) {
  const bool tall = x.rows > x.cols;
  if (tall) x = transpose(x);
  const double n = std::max(norm(x.x), eps);
  for (double& e : x.x) e /= n;
  for (int k = 0; k < steps; ++k) {
    const Mat gram = matmul(x, transpose(x));
    Mat poly = matmul(gram, gram);
    for (std::size_t i = 0; i < poly.x.size(); ++i) poly.x[i] = b * gram.x[i] + c * poly.x[i];
    const Mat px = matmul(poly, x);
    for (std::size_t i = 0; i < x.x.size(); ++i) x.x[i] = a * x.x[i] + px.x[i];
  }
  return tall ? transpose(x) : x;
}

struct Muon {
  double lr = 0.02, momentum = 0.95, wd = 0.1, a = 3.4445, b = -4.7750, c = 2.0315, eps = 1e-7;
  int ns_steps = 5;
  bool nesterov = true;
  int rule = 0;  // 0 original, 1 match_rms_adamw, 2 spectral_unclamped

  /// One step of a tensor seen as rows x (numel / rows).
  void step(Vec& w, const Vec& g, State& s, std::size_t rows) const {
    if (s.m.empty()) s.m.assign(w.size(), 0.0);
    const std::size_t cols = w.size() / rows;
    Mat u{rows, cols, Vec(w.size())};
    for (std::size_t i = 0; i < w.size(); ++i) {
      s.m[i] = momentum * s.m[i] + (1 - momentum) * g[i];
      u.x[i] = nesterov ? momentum * s.m[i] + (1 - momentum) * g[i] : s.m[i];
    }
    const Mat o = newton_schulz(u, a, b, c, ns_steps, eps);
    const double r = static_cast<double>(rows), cc = static_cast<double>(cols);
    const double scale = rule == 0 ? std::sqrt(std::max(1.0, r / cc))
                                   : rule == 1 ? 0.2 * std::sqrt(std::max(r, cc)) : std::sqrt(r / cc);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = w[i] * (1 - lr * wd) - lr * scale * o.x[i];
    ++s.t;
  }
};

/// The identity of size n.
inline Mat identity(std::size_t n) {
  Mat e{n, n, Vec(n * n, 0.0)};
  for (std::size_t i = 0; i < n; ++i) e.x[i * n + i] = 1;
  return e;
}

/// The eigenvectors of a symmetric matrix by cyclic Jacobi rotations, as the
/// columns of the result, largest eigenvalue first.
inline Mat eigenvectors(Mat a) {
  const std::size_t n = a.rows;
  Mat q = identity(n);
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = i + 1; j < n; ++j) off += a.at(i, j) * a.at(i, j);
    if (off < 1e-60) break;
    for (std::size_t p = 0; p < n; ++p) {
      for (std::size_t r = p + 1; r < n; ++r) {
        const double apr = a.at(p, r);
        if (std::abs(apr) < 1e-300) continue;
        const double theta = (a.at(r, r) - a.at(p, p)) / (2 * apr);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
        for (std::size_t k = 0; k < n; ++k) {  // A = A J (columns p, r)
          const double akp = a.x[k * n + p], akr = a.x[k * n + r];
          a.x[k * n + p] = c * akp - sn * akr;
          a.x[k * n + r] = sn * akp + c * akr;
        }
        for (std::size_t k = 0; k < n; ++k) {  // A = J^T A (rows p, r)
          const double apk = a.x[p * n + k], ark = a.x[r * n + k];
          a.x[p * n + k] = c * apk - sn * ark;
          a.x[r * n + k] = sn * apk + c * ark;
        }
        for (std::size_t k = 0; k < n; ++k) {  // Q = Q J
          const double qkp = q.x[k * n + p], qkr = q.x[k * n + r];
          q.x[k * n + p] = c * qkp - sn * qkr;
          q.x[k * n + r] = sn * qkp + c * qkr;
        }
      }
    }
  }
  std::vector<std::size_t> order(n);
  for (std::size_t i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t i, std::size_t j) { return a.at(i, i) > a.at(j, j); });
  Mat sorted{n, n, Vec(n * n)};
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t i = 0; i < n; ++i) sorted.x[i * n + k] = q.at(i, order[k]);
  return sorted;
}

/// The Q of a QR decomposition of a square matrix, by modified Gram-Schmidt
/// twice over (the signs of its columns are free: SOAP's update does not see them).
inline Mat orthonormal_columns(const Mat& a) {
  const std::size_t n = a.rows, m = a.cols;
  Mat q{n, m, Vec(n * m, 0.0)};
  for (std::size_t j = 0; j < m; ++j) {
    Vec col(n);
    for (std::size_t i = 0; i < n; ++i) col[i] = a.at(i, j);
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t k = 0; k < j; ++k) {
        double d = 0;
        for (std::size_t i = 0; i < n; ++i) d += q.at(i, k) * col[i];
        for (std::size_t i = 0; i < n; ++i) col[i] -= d * q.at(i, k);
      }
    }
    const double len = norm(col);
    for (std::size_t i = 0; i < n; ++i) q.x[i * m + j] = col[i] / len;
  }
  return q;
}

/// SOAP (Vyas et al. 2024) on one tensor seen as rows x cols (a 1-D tensor:
/// rows 1, no factor unless precondition_1d), as the authors' code orders it.
struct Soap {
  double lr = 3e-3, b1 = 0.95, b2 = 0.95, shampoo_beta = -1, eps = 1e-8, wd = 0.01;
  std::int64_t frequency = 10, max_dim = 10000;
  bool correct_bias = true, normalize = false, precondition_1d = false;

  struct Side {
    bool on = false;
    Mat factor, basis;
  };
  struct TensorState {
    std::int64_t t = 0;
    bool started = false;
    Mat m, v;  // in the eigenbasis
    Side left, right;
  };

  static Mat outer(const Mat& g, bool left) { return left ? matmul(g, transpose(g)) : matmul(transpose(g), g); }

  // Q_L^T X Q_R (forward) or Q_L X Q_R^T, a side without a factor left alone.
  static Mat rotate(Mat x, const TensorState& s, bool forward) {
    if (s.left.on) x = matmul(forward ? transpose(s.left.basis) : s.left.basis, x);
    if (s.right.on) x = matmul(x, forward ? s.right.basis : transpose(s.right.basis));
    return x;
  }

  void step(Vec& w, const Vec& grad, TensorState& s, std::size_t rows, bool one_d = false) const {
    const std::size_t cols = w.size() / rows;
    const Mat g{rows, cols, grad};
    const double sb = shampoo_beta >= 0 ? shampoo_beta : b2;
    if (!s.started) {  // the factors from this gradient; no update
      s.started = true;
      s.m = Mat{rows, cols, Vec(w.size(), 0.0)};
      s.v = s.m;
      s.left.on = !one_d && static_cast<std::int64_t>(rows) <= max_dim;
      s.right.on = static_cast<std::int64_t>(cols) <= max_dim && (!one_d || precondition_1d);
      for (Side* side : {&s.left, &s.right}) {
        if (!side->on) continue;
        side->factor = outer(g, side == &s.left);
        for (double& e : side->factor.x) e *= 1 - sb;
        side->basis = eigenvectors(side->factor);
      }
      return;
    }
    s.t += 1;
    const Mat gr = rotate(g, s, true);
    Mat n{rows, cols, Vec(w.size())};
    for (std::size_t i = 0; i < w.size(); ++i) {
      s.m.x[i] = b1 * s.m.x[i] + (1 - b1) * gr.x[i];
      s.v.x[i] = b2 * s.v.x[i] + (1 - b2) * gr.x[i] * gr.x[i];
      n.x[i] = s.m.x[i] / (std::sqrt(s.v.x[i]) + eps);
    }
    Mat u = rotate(n, s, false);
    if (normalize) {
      const double rms = norm(u.x) / std::sqrt(static_cast<double>(u.x.size()));
      for (double& e : u.x) e /= rms + 1e-30;
    }
    const double td = static_cast<double>(s.t);
    const double size = correct_bias ? lr * std::sqrt(1 - std::pow(b2, td)) / (1 - std::pow(b1, td)) : lr;
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = (w[i] - size * u.x[i]) * (1 - lr * wd);
    for (Side* side : {&s.left, &s.right}) {
      if (!side->on) continue;
      const Mat o = outer(g, side == &s.left);
      for (std::size_t i = 0; i < o.x.size(); ++i) side->factor.x[i] = sb * side->factor.x[i] + (1 - sb) * o.x[i];
    }
    if (s.t % frequency != 0) return;
    const Mat m_plain = rotate(s.m, s, false);
    for (Side* side : {&s.left, &s.right}) {
      if (!side->on) continue;
      const bool left = side == &s.left;
      const Mat lq = matmul(side->factor, side->basis);
      const std::size_t k = lq.cols;
      std::vector<double> est(k, 0.0);
      for (std::size_t j = 0; j < k; ++j)
        for (std::size_t i = 0; i < k; ++i) est[j] += side->basis.at(i, j) * lq.at(i, j);
      std::vector<std::size_t> order(k);
      for (std::size_t j = 0; j < k; ++j) order[j] = j;
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return est[a] > est[b]; });
      Mat sorted{k, k, Vec(k * k)};
      for (std::size_t j = 0; j < k; ++j)
        for (std::size_t i = 0; i < k; ++i) sorted.x[i * k + j] = lq.at(i, order[j]);
      Mat v = s.v;  // v's rows (left) or columns (right) in the new order
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
          v.x[i * cols + j] = left ? s.v.at(order[i], j) : s.v.at(i, order[j]);
      s.v = v;
      side->basis = orthonormal_columns(sorted);
    }
    s.m = rotate(m_plain, s, true);
  }
};

/// The inverse r-th root of A + eps*I for a symmetric positive semi-definite
/// A, its eigenvalues (by Jacobi) shifted up to eps where the least is below
/// it, as Shi et al.'s implementation.
inline Mat inverse_root(Mat a, double eps, double r) {
  const std::size_t n = a.rows;
  for (std::size_t i = 0; i < n; ++i) a.x[i * n + i] += eps;
  const Mat q = eigenvectors(a);
  const Mat aq = matmul(a, q);
  std::vector<double> lambda(n, 0.0);
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t i = 0; i < n; ++i) lambda[k] += q.at(i, k) * aq.at(i, k);
  const double least = *std::min_element(lambda.begin(), lambda.end());
  Mat out{n, n, Vec(n * n, 0.0)};
  for (std::size_t k = 0; k < n; ++k) {
    const double scale = std::pow(lambda[k] + std::max(eps - least, 0.0), -1.0 / r);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) out.x[i * n + j] += q.at(i, k) * scale * q.at(j, k);
  }
  return out;
}

/// Shampoo with grafting (Gupta et al. 2018, in the order of Shi et al.
/// 2023's implementation) on one tensor seen as rows x cols, cut into blocks
/// of at most max_dim along each side; a 1-D tensor is 1 x n with a right
/// factor only (order 1).
struct Shampoo {
  double lr = 1e-2, b1 = 0.9, b2 = 1.0, eps = 1e-12, momentum = 0, dampening = 0, wd = 0;
  double graft_b2 = 0.999, graft_eps = 1e-10;
  std::int64_t max_dim = 1024, frequency = 1, start = -1, root_override = 0;
  bool nesterov = false, bias_correction = true, decoupled = true, precondition = true;
  std::string grafting = "adam";

  struct Block {
    std::size_t r0 = 0, rows = 0, c0 = 0, cols = 0;
    Mat left, right, left_root, right_root;
  };
  struct TensorState {
    std::int64_t t = 0;
    Vec m, v, u;
    std::vector<Block> blocks;
    bool one_d = false;
  };

  static Mat block(const Vec& x, std::size_t cols, const Block& b) {
    Mat out{b.rows, b.cols, Vec(b.rows * b.cols)};
    for (std::size_t i = 0; i < b.rows; ++i)
      for (std::size_t j = 0; j < b.cols; ++j) out.x[i * b.cols + j] = x[(b.r0 + i) * cols + b.c0 + j];
    return out;
  }

  void step(Vec& w, const Vec& grad, TensorState& s, std::size_t rows, bool one_d = false) const {
    const std::size_t cols = w.size() / rows, n = w.size();
    const auto dim = static_cast<std::size_t>(max_dim);
    if (s.t == 0) {
      s.one_d = one_d;
      s.m.assign(n, 0.0);
      s.v.assign(n, 0.0);
      s.u.assign(n, 0.0);
      if (precondition) {
        for (std::size_t r0 = 0; r0 < rows; r0 += dim) {
          for (std::size_t c0 = 0; c0 < cols; c0 += dim) {
            Block b;
            b.r0 = r0;
            b.c0 = c0;
            b.rows = std::min(dim, rows - r0);
            b.cols = std::min(dim, cols - c0);
            b.left = Mat{b.rows, b.rows, Vec(b.rows * b.rows, 0.0)};
            b.right = Mat{b.cols, b.cols, Vec(b.cols * b.cols, 0.0)};
            b.left_root = identity(b.rows);
            b.right_root = identity(b.cols);
            s.blocks.push_back(b);
          }
        }
      }
    }
    s.t += 1;
    const double td = static_cast<double>(s.t);
    Vec g = grad;
    if (!decoupled)
      for (std::size_t i = 0; i < n; ++i) g[i] += wd * w[i];
    const double decay = b2 == 1 ? 1.0 : b2, weight = b2 == 1 ? 1.0 : 1 - b2;
    const double order = s.one_d ? 1.0 : 2.0;
    const double r = root_override > 0 ? static_cast<double>(root_override) : 2 * order;
    const double factor_bc = bias_correction && b2 < 1 ? 1 - std::pow(b2, td) : 1.0;
    for (Block& b : s.blocks) {
      const Mat gb = block(g, cols, b);
      const Mat gl = matmul(gb, transpose(gb)), gr = matmul(transpose(gb), gb);
      for (std::size_t i = 0; i < gl.x.size(); ++i) b.left.x[i] = decay * b.left.x[i] + weight * gl.x[i];
      for (std::size_t i = 0; i < gr.x.size(); ++i) b.right.x[i] = decay * b.right.x[i] + weight * gr.x[i];
      const std::int64_t first = start < 0 ? frequency : start;
      if (!(s.t == first || (s.t > first && s.t % frequency == 0))) continue;
      Mat l = b.left, rr = b.right;
      for (double& e : l.x) e /= factor_bc;
      for (double& e : rr.x) e /= factor_bc;
      if (!s.one_d) b.left_root = inverse_root(l, eps, r);
      b.right_root = inverse_root(rr, eps, r);
    }
    // The filtered gradient and the graft's direction.
    const double c1 = bias_correction && b1 > 0 ? 1 / (1 - std::pow(b1, td)) : 1.0;
    Vec mh(n), d(n);
    for (std::size_t i = 0; i < n; ++i) {
      s.m[i] = b1 > 0 ? b1 * s.m[i] + (1 - b1) * g[i] : g[i];
      mh[i] = c1 * s.m[i];
      if (grafting == "adam" || grafting == "rmsprop") {
        s.v[i] = graft_b2 * s.v[i] + (1 - graft_b2) * g[i] * g[i];
      } else if (grafting == "adagrad") {
        s.v[i] += g[i] * g[i];
      }
      const double vh = grafting == "adam" ? s.v[i] / (1 - std::pow(graft_b2, td)) : s.v[i];
      d[i] = grafting == "sgd" || grafting == "none" ? mh[i] : mh[i] / (std::sqrt(vh) + graft_eps);
    }
    const std::int64_t first = start < 0 ? frequency : start;
    Vec dir = d;
    if (!s.blocks.empty() && s.t >= first) {
      for (const Block& b : s.blocks) {
        Mat p = block(mh, cols, b);
        if (!s.one_d) p = matmul(b.left_root, p);
        p = matmul(p, b.right_root);
        const double scale = grafting == "none" ? 1.0 : norm(block(d, cols, b).x) / (norm(p.x) + 1e-16);
        for (std::size_t i = 0; i < b.rows; ++i)
          for (std::size_t j = 0; j < b.cols; ++j) dir[(b.r0 + i) * cols + b.c0 + j] = scale * p.at(i, j);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      const double di = dir[i] + (decoupled ? wd * w[i] : 0.0);
      double step = di;
      if (momentum > 0) {
        s.u[i] = momentum * s.u[i] + (1 - dampening) * di;
        step = nesterov ? (1 - dampening) * di + momentum * s.u[i] : s.u[i];
      }
      w[i] -= lr * step;
    }
  }
};

/// torch.optim.AdamW: w = w*(1 - lr*wd) - lr * mh / (sqrt(vh) + eps).
struct AdamW {
  double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;

  void step(Vec& w, const Vec& g, State& s) const {
    if (s.m.empty()) { s.m.assign(w.size(), 0.0); s.v.assign(w.size(), 0.0); }
    s.t += 1;
    const double bc1 = 1 - std::pow(b1, s.t), bc2 = 1 - std::pow(b2, s.t);
    for (std::size_t i = 0; i < w.size(); ++i) {
      s.m[i] = b1 * s.m[i] + (1 - b1) * g[i];
      s.v[i] = b2 * s.v[i] + (1 - b2) * g[i] * g[i];
      w[i] = w[i] * (1 - lr * wd) - lr * (s.m[i] / bc1) / (std::sqrt(s.v[i] / bc2) + eps);
    }
  }
};

}  // namespace ref64
