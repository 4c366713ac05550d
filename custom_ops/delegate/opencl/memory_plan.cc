#include "memory_plan.h"

#include <algorithm>
#include <functional>
#include <numeric>

namespace difflite::gpu {

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

Occupancy::Occupancy(const std::vector<PlanItem>& items, const ObjectPlan& plan)
    : spans_(plan.object_bytes.size()) {
  for (size_t i = 0; i < items.size(); ++i) {
    spans_[plan.object_of[i]].push_back({items[i].first, items[i].last});
  }
}

bool Occupancy::Idle(size_t object, int step) const {
  return std::none_of(spans_[object].begin(), spans_[object].end(),
                      [&](const std::pair<int, int>& s) { return s.first <= step && step <= s.second; });
}

std::vector<size_t> Occupancy::IdleBytes(const ObjectPlan& plan, int step) const {
  std::vector<size_t> bytes;
  for (size_t o = 0; o < spans_.size(); ++o) {
    if (Idle(o, step)) bytes.push_back(plan.object_bytes[o]);
  }
  std::sort(bytes.begin(), bytes.end(), std::greater<size_t>());
  return bytes;
}

}  // namespace difflite::gpu
