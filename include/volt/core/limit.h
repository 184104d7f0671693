#pragma once
/// Limit: "how many batches", given either as a count (int) or as a fraction of the total (double).

#include <cstdint>
#include <ostream>
#include <string>

namespace volt {

/// An int is a batch count, a double a fraction in [0, 1] of the available batches.
class Limit {
 public:
  Limit(int count) : count_(count), fraction_(0), is_fraction_(false) {}          // NOLINT
  Limit(int64_t count) : count_(count), fraction_(0), is_fraction_(false) {}      // NOLINT
  Limit(double fraction) : count_(0), fraction_(fraction), is_fraction_(true) {}  // NOLINT

  bool is_fraction() const { return is_fraction_; }
  int64_t count() const { return count_; }
  double fraction() const { return fraction_; }
  /// Batches to run out of `available`: min(count, available) or floor(fraction * available),
  /// but at least one batch when a non-zero fraction is asked of a non-empty loader.
  int64_t resolve(int64_t available) const;
  /// Throws ConfigError naming `option` when negative or a fraction above 1.
  void validate(const std::string& option) const;

 private:
  int64_t count_;
  double fraction_;
  bool is_fraction_;
};

std::ostream& operator<<(std::ostream& os, const Limit& l);

}  // namespace volt
