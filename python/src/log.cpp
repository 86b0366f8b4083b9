// The library's log lines (spdlog) for Python: kept in a bounded queue that the package drains
// into Python's `logging` (the "distmuon" logger, python/distmuon/_log.py) after each call, so a
// program silences, filters or redirects them as it does torch's. Nothing is printed here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace distmuon::python {
namespace py = pybind11;
namespace {

// Lines logged since the last drain: (spdlog level, text); the oldest are dropped past kMax.
class QueueSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::pair<int, std::string>> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::pair<int, std::string>> out(lines_.begin(), lines_.end());
    lines_.clear();
    return out;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    static constexpr std::size_t kMax = 1000;
    if (lines_.size() == kMax) lines_.pop_front();
    lines_.emplace_back(static_cast<int>(msg.level),
                        std::string(msg.payload.data(), msg.payload.size()));
  }
  void flush_() override {}

 private:
  std::deque<std::pair<int, std::string>> lines_;
};

}  // namespace

void init_log(py::module_& m) {
  static const auto sink = std::make_shared<QueueSink>();
  auto logger = std::make_shared<spdlog::logger>("distmuon", sink);
  logger->set_level(spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
  m.def(
      "take_log_lines", [] { return sink->take(); },
      "The library's log lines since the last call: [(level, text)], spdlog's levels "
      "(0 trace .. 5 critical)");
}

}  // namespace distmuon::python
