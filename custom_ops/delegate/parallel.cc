// Fork-join ParallelFor (see difflite/parallel.h).
#include "difflite/parallel.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace difflite {

void ParallelFor(int num_threads, int64_t n, double cost_per_item,
                 const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  // Below ~200k "operations" a thread start costs more than it saves.
  constexpr double kMinWorkPerThread = 2.0e5;
  int64_t threads = std::max(1, num_threads);
  const double total = static_cast<double>(n) * std::max(cost_per_item, 1.0);
  threads = std::min<int64_t>(threads,
                              static_cast<int64_t>(total / kMinWorkPerThread));
  threads = std::min<int64_t>(threads, n);
  if (threads <= 1) {
    fn(0, n);
    return;
  }
  // The first exception of any worker is rethrown on the caller's thread.
  std::exception_ptr failure;
  std::mutex failure_mu;
  auto guarded = [&](int64_t b, int64_t e) {
    try {
      fn(b, e);
    } catch (...) {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (!failure) failure = std::current_exception();
    }
  };
  std::vector<std::thread> workers;
  workers.reserve(static_cast<size_t>(threads - 1));
  const int64_t chunk = n / threads;
  const int64_t extra = n % threads;
  int64_t begin = 0;
  int64_t first_end = 0;
  for (int64_t t = 0; t < threads; ++t) {
    const int64_t end = begin + chunk + (t < extra ? 1 : 0);
    if (t == 0) {
      first_end = end;
    } else {
      try {
        workers.emplace_back(guarded, begin, end);
      } catch (...) {
        guarded(begin, end);  // no thread available: run it here
      }
    }
    begin = end;
  }
  guarded(0, first_end);
  for (auto& w : workers) w.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace difflite
