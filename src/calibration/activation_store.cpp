#include "calibration/activation_store.h"

#include <sys/stat.h>
#include <zstd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "core/io.h"
#include "core/temporaries.h"

namespace qf {

ActivationStore::ActivationStore(std::vector<size_t> sizes, uint64_t max_bytes, const std::filesystem::path& spill_beside)
    : sizes_(std::move(sizes)) {
  uint64_t total = 0;
  for (size_t s : sizes_) total += s * sizeof(float);
  if (max_bytes == 0 || total <= max_bytes) {
    mem_.resize(sizes_.size());
    return;
  }
  namespace fs = std::filesystem;
  const fs::path beside = spill_beside.empty() ? fs::temp_directory_path() / "quantforge-activations" : spill_beside;
  remove_stale_temporaries(beside);
  dir_ = create_temporary_folder(beside, "spill", 0700);  // private: activations are data
  if (dir_.empty())
    throw io_error(beside.parent_path().string(), "cannot create a folder for spilled activations: " + std::string(std::strerror(errno)));
}

ActivationStore::~ActivationStore() {
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    unregister_temporary(dir_);
  }
}

std::filesystem::path ActivationStore::file(size_t i) const { return dir_ / (std::to_string(i) + ".zst"); }

uint64_t ActivationStore::bytes_on_disk() const {
  uint64_t b = 0;
  if (dir_.empty()) return 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir_, ec)) b += e.file_size(ec);
  return b;
}

void ActivationStore::store(size_t i, const std::vector<float>& x) {
  if (x.size() != sizes_.at(i)) throw Error(ErrorKind::Internal, "ActivationStore: sample size changed");
  if (dir_.empty()) {
    mem_[i] = x;
    return;
  }
  const size_t src = x.size() * sizeof(float);
  std::string buf(ZSTD_compressBound(src), '\0');
  const size_t n = ZSTD_compress(buf.data(), buf.size(), x.data(), src, 1);
  if (ZSTD_isError(n)) throw io_error(file(i).string(), std::string("zstd: ") + ZSTD_getErrorName(n));
  // A private scratch file: no rename or fsync needed.
  std::ofstream f(file(i), std::ios::binary | std::ios::trunc);
  f.write(buf.data(), static_cast<std::streamsize>(n));
  if (!f) throw io_error(file(i).string(), "cannot write spilled activations (disk full?)");
}

std::vector<float> ActivationStore::load(size_t i) const {
  if (dir_.empty()) return mem_.at(i);
  const std::string buf = read_text_file(file(i));
  std::vector<float> x(sizes_.at(i));
  const size_t n = ZSTD_decompress(x.data(), x.size() * sizeof(float), buf.data(), buf.size());
  if (ZSTD_isError(n) || n != x.size() * sizeof(float))
    throw io_error(file(i).string(), "spilled activations are damaged");
  return x;
}

uint64_t parse_memory_size(const std::string& s, const std::string& flag) {
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    pos = 0;
  }
  std::string unit = s.substr(pos);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.size() > 1 && unit.back() == 'B') unit.pop_back();
  if (unit.size() > 1 && unit.back() == 'I') unit.pop_back();
  double mult = 0;
  if (unit.empty()) mult = 1;
  else if (unit == "K") mult = 1024.0;
  else if (unit == "M") mult = 1024.0 * 1024;
  else if (unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  if (pos == 0 || mult == 0 || !(v * mult >= 1.0) || !(v * mult < 9.0e18) || !std::isfinite(v))
    throw Error(ErrorKind::Usage, flag + " must be a size such as 512M or 8G, got '" + s + "'");
  return static_cast<uint64_t>(v * mult);
}

}  // namespace qf
