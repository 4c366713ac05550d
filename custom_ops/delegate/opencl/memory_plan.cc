#include "memory_plan.h"

#include <algorithm>
#include <limits>
#include <numeric>

namespace difflite::gpu {

size_t PlanArena(std::vector<PlanItem>* items, size_t align) {
  if (align == 0) align = 1;
  auto round_up = [align](size_t n) { return (n + align - 1) / align * align; };
  std::vector<size_t> order(items->size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const PlanItem& x = (*items)[a];
    const PlanItem& y = (*items)[b];
    if (x.bytes != y.bytes) return x.bytes > y.bytes;
    return x.first < y.first;
  });
  std::vector<size_t> placed;  // indices, kept sorted by offset
  size_t arena = 0;
  std::vector<size_t> overlapping;
  for (size_t idx : order) {
    PlanItem& it = (*items)[idx];
    const size_t need = round_up(std::max<size_t>(it.bytes, 1));
    overlapping.clear();
    for (size_t p : placed) {
      const PlanItem& q = (*items)[p];
      if (q.first <= it.last && it.first <= q.last) overlapping.push_back(p);
    }
    // `placed` is sorted by offset, so `overlapping` is too.
    size_t best = std::numeric_limits<size_t>::max();
    size_t best_waste = std::numeric_limits<size_t>::max();
    size_t cursor = 0;
    for (size_t p : overlapping) {
      const PlanItem& q = (*items)[p];
      if (q.offset >= cursor) {
        const size_t gap = q.offset - cursor;
        if (gap >= need && gap - need < best_waste) {
          best = cursor;
          best_waste = gap - need;
        }
      }
      cursor = std::max(cursor, round_up(q.offset + std::max<size_t>(q.bytes, 1)));
    }
    if (best == std::numeric_limits<size_t>::max()) best = cursor;
    it.offset = best;
    arena = std::max(arena, best + need);
    auto pos = std::upper_bound(placed.begin(), placed.end(), idx,
                                [&](size_t a, size_t b) {
                                  return (*items)[a].offset < (*items)[b].offset;
                                });
    placed.insert(pos, idx);
  }
  return arena;
}

ObjectPlan PlanSharedObjects(const std::vector<PlanItem>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
    return items[a].first < items[b].first;
  });
  ObjectPlan plan;
  plan.object_of.assign(items.size(), 0);
  std::vector<std::vector<size_t>> users;  // items per object
  for (size_t idx : order) {
    const PlanItem& it = items[idx];
    size_t chosen = users.size();
    for (size_t o = 0; o < users.size(); ++o) {
      const bool free = std::none_of(users[o].begin(), users[o].end(), [&](size_t u) {
        return items[u].first <= it.last && it.first <= items[u].last;
      });
      if (free && (chosen == users.size() || plan.object_bytes[o] < plan.object_bytes[chosen])) {
        chosen = o;
      }
    }
    if (chosen == users.size()) {
      users.emplace_back();
      plan.object_bytes.push_back(std::max<size_t>(it.bytes, 4));
      plan.total_bytes += plan.object_bytes.back();
    }
    users[chosen].push_back(idx);
    plan.object_of[idx] = chosen;
  }
  return plan;
}

}  // namespace difflite::gpu
