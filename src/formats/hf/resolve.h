// Resolving a model argument to the folder that holds config.json.
//
// Accepted forms:
//   - a plain model folder (config.json inside);
//   - a Hugging Face cache repo folder, models--ORG--NAME, holding refs/ and
//     snapshots/REV/: the snapshot named by refs/<revision> (default "main"),
//     or the only snapshot when there is no ref;
//   - a snapshot folder itself (…/snapshots/REV);
//   - a repo id ORG/NAME that is not a local path: looked up in the cache
//     ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).
// Nothing is ever downloaded.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace qf {

struct ResolvedModel {
  std::filesystem::path dir;  // folder with config.json and weights
  std::string kind;           // "folder", "hf-cache"
  std::string repo_id;        // ORG/NAME for the cache forms
  std::string revision;       // ref name or commit
  std::string commit;         // snapshot folder name for the cache forms
};

ResolvedModel resolve_model(const std::string& arg, const std::string& revision = "main");

// The file or folder a model argument reads (a .gguf or .bin file, or the
// resolved Hugging Face folder), so that outputs can be checked against it;
// empty when the argument is empty or cannot be resolved (loading the model
// reports that).
std::filesystem::path model_input_path(const std::string& model);

// The regular files of a model folder (symbolic links followed, as in a cache
// snapshot), sorted by name, as [{"name", "bytes", "mtime"}]: what resuming
// and batch runs compare to tell whether a model changed. Names, not paths,
// so the same files reached by another path or host compare equal.
nlohmann::ordered_json model_file_stats(const std::filesystem::path& dir);

// The Hugging Face hub cache folder this process would search.
std::filesystem::path hf_hub_cache_dir();

// The repo ids (ORG/NAME) of the models in that cache (its models--ORG--NAME
// folders with snapshots), sorted; empty when there is no cache.
std::vector<std::string> cached_repo_ids();

}  // namespace qf
