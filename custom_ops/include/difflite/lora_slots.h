// The run-time LoRA factors of one delegate (difflite.LoRA, ops/lora/): for each slot, the layer
// its op runs (K in, N out features, known once the delegate prepared the op) and the factors set
// for it between Invokes (difflite_lora_set, delegate.cc), held as that op's backend side wants
// them (host floats on the CPU backend, device buffers on OpenCL).
//
// An op takes a Hold on its slot when it is prepared (the CPU backend: OpInstance::BindDelegate;
// OpenCL: the op's factory, GpuContext::lora_slots()) and reads the slot's current factors at
// every Run through it. A slot is known to Set while an op holds it; its factors are freed when
// they are replaced or cleared, when the last op holding the slot goes, or when the delegate goes
// (Clear). The table is shared: holds keep it alive (TFLite may free partitions after the
// delegate), and every member is safe to call from any thread.
#ifndef DIFFLITE_LORA_SLOTS_H_
#define DIFFLITE_LORA_SLOTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace difflite {

// One set of a slot's factors as a backend holds them: made once per set, never changed.
class LoraFactors {
 public:
  virtual ~LoraFactors() = default;
  int rank = 0;          // r >= 1
  int in_features = 0;   // K
  int out_features = 0;  // N
  size_t bytes = 0;      // what the backend holds for them
};

class LoraSlots : public std::enable_shared_from_this<LoraSlots> {
 public:
  static constexpr int kMaxSlot = 65535;   // the op's `slot` attribute: 0 .. 65535
  static constexpr int kMaxRank = 65536;

  // A backend's copy of factors down = D [rank][K] and up = U [N][rank] (row-major float32, the
  // caller's arrays, already checked: finite values, rank * K and N * rank at most 2^31 - 1).
  // nullptr and a one-line *error where it cannot make one (memory).
  using Store = std::function<std::unique_ptr<LoraFactors>(int rank, int k, int n, const float* down,
                                                           const float* up, std::string* error)>;

  // One op's hold on its slot.
  class Hold {
   public:
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;
    ~Hold();
    int slot() const { return slot_; }
    int in_features() const { return k_; }
    int out_features() const { return n_; }
    // The factors set now; nullptr where none are (rank 0). What one Run uses: a set during the
    // Run (which the contract rules out) would not change them under it.
    std::shared_ptr<const LoraFactors> Factors() const;

   private:
    friend class LoraSlots;
    Hold(std::shared_ptr<LoraSlots> table, int slot, int k, int n)
        : table_(std::move(table)), slot_(slot), k_(k), n_(n) {}
    std::shared_ptr<LoraSlots> table_;
    int slot_, k_, n_;
  };

  // Registers an op of `slot` that runs a K -> N layer and stores factors with `store`. nullptr
  // and a one-line *error where the slot is out of range or held by an op of another layer.
  std::unique_ptr<Hold> Attach(int slot, int k, int n, Store store, std::string* error);

  // difflite_lora_set, after the entry point checked its pointers: rank 0 clears the slot (down,
  // up, k and n are not read); else D [rank][k], U [n][rank] replace the slot's factors. "" or the
  // one-line reason; a failed call leaves the slot's factors as they were.
  std::string Set(int slot, int rank, int k, int n, const float* down, const float* up);

  // The delegate goes: every slot's factors are freed, and later Sets fail. Holds stay valid and
  // see no factors.
  void Clear();

  // Bytes of factors held, all slots together (logs).
  size_t FactorBytes() const;

 private:
  struct Entry {
    int k = 0, n = 0;
    int holds = 0;
    Store store;  // the latest hold's: every op of one delegate runs on the same backend
    std::shared_ptr<const LoraFactors> factors;
  };
  void Release(int slot);

  mutable std::mutex mutex_;
  std::map<int, Entry> entries_;
  bool closed_ = false;
};

}  // namespace difflite

#endif  // DIFFLITE_LORA_SLOTS_H_
