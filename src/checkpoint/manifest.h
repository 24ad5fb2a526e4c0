// A checksum manifest for an exported model folder: every file with its size
// and SHA-256, so that a copy (or an upload) can be verified byte for byte.
//
// File name: quantforge_manifest.json, beside config.json. Named after the tool
// so that no loader mistakes it for one of its own files (transformers, vLLM and
// llama.cpp ignore unknown files in a model folder), and distinct from the
// Hugging Face hub's own metadata. Content:
//   {"format": "quantforge-manifest", "version": 1,
//    "files": [{"path": "config.json", "bytes": 712, "sha256": "<64 hex>"}, ...]}
// paths relative to the folder with '/' separators, sorted bytewise; every
// regular file under the folder (recursively, symlinks followed) except the
// manifest itself. Written atomically (write_file_atomic).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace qf {

inline constexpr const char* kManifestFileName = "quantforge_manifest.json";

struct ManifestEntry {
  std::string path;    // relative, '/'-separated
  uint64_t bytes = 0;
  std::string sha256;  // lower-case hex
};

// Lists and hashes the files of `dir` (sorted by path; the manifest excluded).
// Throws NotFound when dir is not a folder, Io when a file cannot be read.
std::vector<ManifestEntry> compute_manifest(const std::filesystem::path& dir);

// Writes dir/quantforge_manifest.json for the folder's current contents.
void write_manifest(const std::filesystem::path& dir);

// Re-hashes the folder and compares it with its manifest. Returns one line per
// problem ("model.safetensors: sha256 differs", "extra.bin: not in the manifest",
// "config.json: missing"); empty when everything matches. Throws NotFound for a
// missing manifest, InvalidInput for a malformed one.
std::vector<std::string> verify_manifest(const std::filesystem::path& dir);

}  // namespace qf
