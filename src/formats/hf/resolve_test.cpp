#include "formats/hf/resolve.h"

#include <cstdlib>

#include <gtest/gtest.h>

#include "test_util.h"

namespace qf {
namespace {

namespace fs = std::filesystem;

// models--acme--tiny/{refs/main, snapshots/<commit>/config.json}
fs::path make_cache_repo(const fs::path& root, const std::string& commit, bool with_ref = true) {
  fs::path repo = root / "models--acme--tiny-model";
  test::write_file(repo / "snapshots" / commit / "config.json", "{}");
  if (with_ref) test::write_file(repo / "refs" / "main", commit + "\n");
  return repo;
}

TEST(Resolve, PlainFolder) {
  test::TempDir d;
  test::write_file(d / "config.json", "{}");
  ResolvedModel m = resolve_model(d.path().string());
  EXPECT_EQ(m.kind, "folder");
  EXPECT_EQ(m.dir, d.path());
}

TEST(Resolve, CacheRepoFollowsRef) {
  test::TempDir d;
  fs::path repo = make_cache_repo(d.path(), "abc123");
  test::write_file(repo / "snapshots" / "older" / "config.json", "{}");
  ResolvedModel m = resolve_model(repo.string());
  EXPECT_EQ(m.kind, "hf-cache");
  EXPECT_EQ(m.repo_id, "acme/tiny-model");
  EXPECT_EQ(m.commit, "abc123");
  EXPECT_EQ(m.dir, repo / "snapshots" / "abc123");
  EXPECT_EQ(resolve_model(repo.string(), "older").dir, repo / "snapshots" / "older");
}

TEST(Resolve, SingleSnapshotWithoutRef) {
  test::TempDir d;
  fs::path repo = make_cache_repo(d.path(), "only", false);
  EXPECT_EQ(resolve_model(repo.string()).commit, "only");
  test::write_file(repo / "snapshots" / "second" / "config.json", "{}");
  EXPECT_QF_ERROR(resolve_model(repo.string()), ErrorKind::NotFound, "snapshots: only, second");
}

TEST(Resolve, RefToMissingSnapshot) {
  test::TempDir d;
  fs::path repo = make_cache_repo(d.path(), "abc");
  test::write_file(repo / "refs" / "main", "def");
  EXPECT_QF_ERROR(resolve_model(repo.string()), ErrorKind::NotFound, "points at commit def");
}

TEST(Resolve, RepoIdThroughCacheEnv) {
  test::TempDir d;
  make_cache_repo(d.path(), "abc");
  setenv("HF_HUB_CACHE", d.path().c_str(), 1);
  ResolvedModel m = resolve_model("acme/tiny-model");
  EXPECT_EQ(m.commit, "abc");
  EXPECT_QF_ERROR(resolve_model("acme/other"), ErrorKind::NotFound, "nothing is downloaded");
  unsetenv("HF_HUB_CACHE");
}

TEST(Resolve, SnapshotFolderKnowsItsRepo) {
  test::TempDir d;
  fs::path repo = make_cache_repo(d.path(), "abc");
  ResolvedModel m = resolve_model((repo / "snapshots" / "abc").string());
  EXPECT_EQ(m.kind, "hf-cache");
  EXPECT_EQ(m.repo_id, "acme/tiny-model");
}

TEST(Resolve, Missing) {
  EXPECT_QF_ERROR(resolve_model("/nonexistent/qf/model"), ErrorKind::NotFound, "no such model folder");
}

}  // namespace
}  // namespace qf
