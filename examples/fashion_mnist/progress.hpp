// Rank 0's progress display: a bar redrawn in place (images/s, loss, ETA) when stdout is a
// terminal, nothing otherwise (the job then prints one plain line per epoch).
#pragma once

#include <cstdio>
#include <string>

namespace fmnist {

class Progress {
 public:
  explicit Progress(bool enabled) : enabled_(enabled) {}
  void start(const std::string& label) { label_ = label; }
  void update(int done, int total, double images, double loss, double seconds) {
    if (!enabled_ || (done % 10 != 0 && done != total)) return;
    constexpr int width = 30;
    const int filled = total > 0 ? width * done / total : width;
    const double rate = seconds > 0 ? images / seconds : 0;
    const double eta = done > 0 ? seconds * (total - done) / done : 0;
    std::printf("\r%s [%s%s] %3d%% %7.0f images/s  loss %.4f  ETA %4.0f s ", label_.c_str(),
                std::string(static_cast<std::size_t>(filled), '=').c_str(),
                std::string(static_cast<std::size_t>(width - filled), ' ').c_str(), 100 * done / total, rate, loss,
                eta);
    std::fflush(stdout);
  }
  void finish() {
    if (enabled_) std::printf("\r%*s\r", 110, "");
  }

 private:
  bool enabled_;
  std::string label_;
};

}  // namespace fmnist
