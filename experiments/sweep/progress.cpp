// The progress board (progress.h).
#include "progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>

namespace bigbatch::experiments {

ProgressBoard::ProgressBoard(std::int64_t total) : total_(total), tty_(isatty(fileno(stderr)) != 0) {}

void ProgressBoard::update(const std::string& trial, const TrialProgress& p) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_[trial] = p;
  const auto now = std::chrono::steady_clock::now();
  const double since = std::chrono::duration<double>(now - last_).count();
  if (tty_ ? since < 0.2 : since < 10) return;
  last_ = now;
  std::ostringstream line;
  line << "[" << done_ << "/" << total_ << " done]";
  for (const auto& [name, q] : live_) {
    const double eta = q.steps_per_second > 0 ? static_cast<double>(q.budget - q.step) / q.steps_per_second : 0;
    line << " " << name << " step " << q.step << "/" << q.budget << " "
         << (100 * q.step / std::max<std::int64_t>(1, q.budget)) << "% loss " << std::setprecision(3) << q.loss
         << " " << std::setprecision(3) << q.steps_per_second << " steps/s ETA " << std::fixed
         << std::setprecision(0) << eta << "s" << std::defaultfloat << ";";
  }
  if (tty_) {
    std::string text = line.str();
    if (text.size() > 200) text = text.substr(0, 197) + "...";
    std::cerr << "\r\033[K" << text << std::flush;
  } else {
    std::cerr << line.str() << "\n";
  }
}

void ProgressBoard::finished(const std::string& trial, const TrialResult& r, Metric metric) {
  std::lock_guard<std::mutex> lock(mutex_);
  live_.erase(trial);
  ++done_;
  std::ostringstream line;
  line << "[" << done_ << "/" << total_ << "] " << trial << ": " << to_string(r.status);
  if (r.steps_to_target) line << " at step " << *r.steps_to_target;
  line << " (best " << to_string(metric) << " " << std::setprecision(4) << r.best_metric << ", " << r.steps
       << " steps, " << std::setprecision(3) << r.wall_time << " s)";
  std::cerr << (tty_ ? "\r\033[K" : "") << line.str() << "\n";
}

}  // namespace bigbatch::experiments
