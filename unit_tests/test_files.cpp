// core/atomic_file: every failure names the path, leaves the old file as it was and no temporary
// behind. The full-disk case needs a small tmpfs and runs as its own ctest entry (check_disk_full.sh).
#include <catch2/catch.hpp>
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/timeline.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <sstream>
#include <string>

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}
bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}
/// A fresh directory for this test process.
std::string scratch_dir() {
  const std::string dir = "kdist_test_files." + std::to_string(static_cast<long long>(::getpid()));
  ::mkdir(dir.c_str(), 0755);
  return dir;
}
}  // namespace

TEST_CASE("write_file_atomically replaces a file and leaves no temporary", "[core][files]") {
  const std::string dir = scratch_dir(), path = dir + "/a.json";
  kdist::write_file_atomically(path, "old\n");
  kdist::write_file_atomically(path, "new contents\n");
  CHECK(read_all(path) == "new contents\n");
  CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(path)));
  CHECK(kdist::probe_file_writable(path) == 0);
  CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(path)));
  kdist::write_file_atomically(path, "");  // empty is a valid file
  CHECK(read_all(path).empty());
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("write_file_atomically into a missing directory names the path", "[core][files]") {
  const std::string path = "/nonexistent-kdist-dir/sub/c.json";
  REQUIRE_THROWS_AS(kdist::write_file_atomically(path, "x"), kdist::Error);
  REQUIRE_THROWS_WITH(
      kdist::write_file_atomically(path, "x", "kdist::test"),
      Catch::StartsWith("kdist::test: cannot write '" + path + "'") && Catch::Contains("No such file or directory"));
  CHECK(kdist::probe_file_writable(path) == ENOENT);
  REQUIRE_THROWS_WITH(kdist::check_file_writable(path), Catch::Contains(path));
  CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(path)));
}

TEST_CASE("write_file_atomically under a regular file (not a directory) names the path", "[core][files]") {
  const std::string dir = scratch_dir(), file = dir + "/plain", path = file + "/c.json";
  kdist::write_file_atomically(file, "I am a file\n");
  REQUIRE_THROWS_WITH(kdist::write_file_atomically(path, "x"),
                      Catch::Contains(path) && Catch::Contains("Not a directory"));
  CHECK(kdist::probe_file_writable(path) == ENOTDIR);
  CHECK(read_all(file) == "I am a file\n");
  ::unlink(file.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("a failed rename removes the temporary and keeps the destination", "[core][files]") {
  // The destination is a non-empty directory: the temporary is written, the rename fails.
  const std::string dir = scratch_dir(), target = dir + "/target", inner = target + "/keep";
  ::mkdir(target.c_str(), 0755);
  kdist::write_file_atomically(inner, "kept\n");
  REQUIRE_THROWS_WITH(kdist::write_file_atomically(target, "x"),
                      Catch::Contains("cannot replace '" + target + "'") && Catch::Contains("removed"));
  CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(target)));
  CHECK(read_all(inner) == "kept\n");
  CHECK(kdist::probe_file_writable(target) == EISDIR);
  ::unlink(inner.c_str());
  ::rmdir(target.c_str());
  ::rmdir(dir.c_str());
}

TEST_CASE("Timeline::write goes through the atomic writer", "[core][files][timeline]") {
  const std::string dir = scratch_dir(), path = dir + "/trace.json", target = dir + "/busy";
  kdist::Timeline tl(0);
  tl.write(path);
  CHECK(read_all(path) == tl.to_json() + "\n");
  ::mkdir(target.c_str(), 0755);
  ::mkdir((target + "/x").c_str(), 0755);
  REQUIRE_THROWS_WITH(tl.write(target), Catch::StartsWith("kdist::Timeline::write: cannot replace '" + target));
  CHECK_FALSE(exists(kdist::impl::atomic_temporary_path(target)));
  ::rmdir((target + "/x").c_str());
  ::rmdir(target.c_str());
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}
