#include "formats/tensor_naming.h"

namespace qf {
namespace {

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// Replaces the longest prefix `from` of `name` among the pairs by its partner.
template <bool kToStored>
std::string rename(const std::vector<std::pair<std::string, std::string>>& prefixes, const std::string& name) {
  const std::pair<std::string, std::string>* best = nullptr;
  for (const auto& pr : prefixes) {
    const std::string& from = kToStored ? pr.first : pr.second;
    if (starts_with(name, from) && (!best || from.size() > (kToStored ? best->first : best->second).size())) best = &pr;
  }
  if (!best) return name;
  const std::string& from = kToStored ? best->first : best->second;
  const std::string& to = kToStored ? best->second : best->first;
  return to + name.substr(from.size());
}

}  // namespace

bool TensorNaming::identity() const {
  for (const auto& [working, stored] : prefixes)
    if (working != stored) return false;
  return true;
}

std::string TensorNaming::to_stored(const std::string& name) const { return rename<true>(prefixes, name); }

std::string TensorNaming::module_to_stored(const std::string& module) const {
  std::string s = to_stored(module + ".");  // the prefixes end in a dot
  s.pop_back();
  return s;
}

std::string TensorNaming::to_working(const std::string& stored) const { return rename<false>(prefixes, stored); }

}  // namespace qf
