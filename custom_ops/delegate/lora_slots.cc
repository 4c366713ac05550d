// The delegate's run-time LoRA factors (include/difflite/lora_slots.h).
#include "difflite/lora_slots.h"

#include <cmath>
#include <cstdint>
#include <new>
#include <tuple>

namespace difflite {

namespace {

std::string SlotName(int slot) { return "slot " + std::to_string(slot); }

// The first element of `values` that is not finite, or -1.
int64_t FirstNotFinite(const float* values, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(values[i])) return i;
  }
  return -1;
}

}  // namespace

LoraSlots::Hold::~Hold() { table_->Release(slot_); }

std::shared_ptr<const LoraFactors> LoraSlots::Hold::Factors() const {
  std::lock_guard<std::mutex> lock(table_->mutex_);
  auto it = table_->entries_.find(slot_);
  if (it == table_->entries_.end()) return nullptr;
  const std::shared_ptr<const LoraFactors>& f = it->second.factors;
  // Factors of another layer never reach an op (Attach refuses a second layer for a slot).
  if (f == nullptr || f->in_features != k_ || f->out_features != n_) return nullptr;
  return f;
}

std::unique_ptr<LoraSlots::Hold> LoraSlots::Attach(int slot, int k, int n, Store store,
                                                   std::string* error) {
  if (slot < 0 || slot > kMaxSlot) {
    *error = SlotName(slot) + " out of range (0.." + std::to_string(kMaxSlot) + ")";
    return nullptr;
  }
  if (k <= 0 || n <= 0 || store == nullptr) {
    *error = SlotName(slot) + ": a " + std::to_string(k) + " -> " + std::to_string(n) +
             " layer takes no factors";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(slot);
  if (it != entries_.end() && (it->second.k != k || it->second.n != n)) {
    *error = SlotName(slot) + " is a " + std::to_string(it->second.k) + " -> " +
             std::to_string(it->second.n) + " layer's in another op of this delegate, this op's layer is " +
             std::to_string(k) + " -> " + std::to_string(n);
    return nullptr;
  }
  Entry& e = entries_[slot];
  e.k = k;
  e.n = n;
  ++e.holds;
  e.store = std::move(store);
  return std::unique_ptr<Hold>(new Hold(shared_from_this(), slot, k, n));
}

void LoraSlots::Release(int slot) {
  std::shared_ptr<const LoraFactors> freed;  // released after the lock
  Store store;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = entries_.find(slot);
  if (it == entries_.end()) return;
  if (--it->second.holds > 0) return;
  freed = std::move(it->second.factors);
  store = std::move(it->second.store);
  entries_.erase(it);
}

std::string LoraSlots::Set(int slot, int rank, int k, int n, const float* down, const float* up) {
  if (slot < 0 || slot > kMaxSlot) {
    return SlotName(slot) + " out of range (0.." + std::to_string(kMaxSlot) + ")";
  }
  if (rank < 0 || rank > kMaxRank) {
    return "rank " + std::to_string(rank) + " out of range (0.." + std::to_string(kMaxRank) + ")";
  }
  std::shared_ptr<const LoraFactors> replaced;  // freed once the lock is released
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return "the delegate is being destroyed";
  auto it = entries_.find(slot);
  if (it == entries_.end()) return SlotName(slot) + ": this model has no LoRA op of that slot";
  Entry& e = it->second;
  if (rank == 0) {
    replaced = std::move(e.factors);
    return "";
  }
  const std::string r = std::to_string(rank);
  if (k != e.k || n != e.n) {
    return SlotName(slot) + ": factors are [" + r + " x " + std::to_string(k) + "] and [" +
           std::to_string(n) + " x " + r + "] but the slot's layer is " + std::to_string(e.k) +
           " -> " + std::to_string(e.n);
  }
  if (down == nullptr || up == nullptr) {
    return SlotName(slot) + ": " + (down == nullptr ? "down" : "up") + " is NULL for rank " + r;
  }
  const int64_t down_count = int64_t{rank} * k, up_count = int64_t{n} * rank;
  if (down_count > INT32_MAX || up_count > INT32_MAX) {
    return SlotName(slot) + ": factors of rank " + r + " for a " + std::to_string(k) + " -> " +
           std::to_string(n) + " layer hold more than 2^31 - 1 values";
  }
  for (const auto& [name, values, count] :
       {std::make_tuple("down", down, down_count), std::make_tuple("up", up, up_count)}) {
    const int64_t bad = FirstNotFinite(values, count);
    if (bad >= 0) {
      return SlotName(slot) + ": " + name + " holds a value that is not finite (element " +
             std::to_string(bad) + ")";
    }
  }
  std::string error;
  std::unique_ptr<LoraFactors> made;
  try {
    made = e.store(rank, k, n, down, up, &error);
  } catch (const std::bad_alloc&) {
    error = "out of memory for " + SlotName(slot) + "'s factors (" +
            std::to_string((down_count + up_count) * 4) + " bytes)";
  }
  if (made == nullptr) {
    return error.empty() ? SlotName(slot) + ": the factors could not be stored" : error;
  }
  made->rank = rank;
  made->in_features = k;
  made->out_features = n;
  replaced = std::move(e.factors);
  e.factors = std::move(made);
  return "";
}

void LoraSlots::Clear() {
  std::map<int, Entry> gone;  // factors (device buffers) freed after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  for (auto& kv : entries_) gone[kv.first].factors = std::move(kv.second.factors);
}

size_t LoraSlots::FactorBytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t bytes = 0;
  for (const auto& kv : entries_) {
    if (kv.second.factors != nullptr) bytes += kv.second.factors->bytes;
  }
  return bytes;
}

}  // namespace difflite
