// What the schedules' tests share: the message of a c10::Error.
#pragma once

#include <c10/util/Exception.h>

#include <string>

namespace bigbatch::testing_support {

/// The message of the c10::Error that f throws, without LibTorch's backtrace,
/// or "(no error)".
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

}  // namespace bigbatch::testing_support
