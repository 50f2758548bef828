// Catching LibTorch's warnings (TORCH_WARN) in C++, as Python's
// warnings.catch_warnings does: the handler's interface differs between 1.13
// (c10::Warning::WarningHandlerGuard; process(location, message, verbatim))
// and 2.x (c10::WarningUtils::WarningHandlerGuard; process(const c10::Warning&)).
#pragma once

#include <c10/util/Exception.h>
#include <torch/version.h>

#include <string>
#include <vector>

namespace bigbatch::compat {

/// While it lives, the warnings raised (on this thread, in 2.x, whose handler
/// is per thread) are kept in messages() instead of printed.
class WarningCollector {
 public:
  WarningCollector() : handler_(messages_), guard_(&handler_) {}
  WarningCollector(const WarningCollector&) = delete;
  WarningCollector& operator=(const WarningCollector&) = delete;

  const std::vector<std::string>& messages() const { return messages_; }

 private:
  struct Handler : c10::WarningHandler {
    explicit Handler(std::vector<std::string>& out) : out(out) {}
#if TORCH_VERSION_MAJOR >= 2
    void process(const c10::Warning& warning) override { out.push_back(warning.msg()); }
#else
    void process(const c10::SourceLocation&, const std::string& message, const bool) override {
      out.push_back(message);
    }
#endif
    std::vector<std::string>& out;
  };

  std::vector<std::string> messages_;
  Handler handler_;
#if TORCH_VERSION_MAJOR >= 2
  c10::WarningUtils::WarningHandlerGuard guard_;
#else
  c10::Warning::WarningHandlerGuard guard_;
#endif
};

}  // namespace bigbatch::compat
