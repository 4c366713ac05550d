// A minimal fork-join loop over std::thread: enough for the reference
// kernels, no pool, no third-party runtime.
#ifndef DIFFLITE_PARALLEL_H_
#define DIFFLITE_PARALLEL_H_

#include <cstdint>
#include <functional>

namespace difflite {

// Calls fn(begin, end) on disjoint contiguous ranges covering [0, n), on up to
// `num_threads` threads (the caller's thread included). Runs serially when
// n * cost_per_item is small (thread start-up would dominate). `fn` must be
// safe to run concurrently on disjoint ranges.
void ParallelFor(int num_threads, int64_t n, double cost_per_item,
                 const std::function<void(int64_t, int64_t)>& fn);

}  // namespace difflite

#endif  // DIFFLITE_PARALLEL_H_
