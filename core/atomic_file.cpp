// Write-to-temporary, fsync, close, rename, fsync the directory. Each step can fail on its own:
// write() with ENOSPC or EDQUOT (tmpfs, quotas), fsync() and close() with EIO or ENOSPC on
// filesystems that allocate lazily (NFS, XFS delayed allocation), rename() with EXDEV, EISDIR or
// EACCES. std::ofstream hides all but the first behind its buffer, which is how a full disk used
// to leave an empty calibration file in place of a good one.
#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kdist {

namespace {

[[noreturn]] void fail(const char* operation, const char* step, const std::string& path, int err) {
  throw Error(std::string(operation) + ": cannot " + step + " '" + path + "': " + std::strerror(err));
}

std::string directory_of(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

int open_temporary(const std::string& tmp) {
  int fd;
  do {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

/// Writes all of `data`; returns 0 or the errno of the failing write.
int write_all(int fd, const char* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

void sync_directory(const std::string& path) {
  const int dfd = ::open(directory_of(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;  // best effort: the rename itself has happened
  (void)::fsync(dfd);
  (void)::close(dfd);
}

/// Removes the temporary, then throws naming the destination, the temporary and `err`.
[[noreturn]] void discard(const char* operation, const char* step, const std::string& path, const std::string& tmp,
                          int err) {
  (void)::unlink(tmp.c_str());
  throw Error(std::string(operation) + ": cannot " + step + " '" + path + "' (temporary '" + tmp +
              "', removed): " + std::strerror(err));
}

}  // namespace

std::string impl::atomic_temporary_path(const std::string& path) {
  return path + ".tmp." + std::to_string(static_cast<long long>(::getpid()));
}

void write_file_atomically(const std::string& path, const std::string& contents, const char* operation) {
  const std::string tmp = impl::atomic_temporary_path(path);
  const int fd = open_temporary(tmp);
  if (fd < 0) fail(operation, "write", path, errno);
  int err = write_all(fd, contents.data(), contents.size());
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (err != 0) {
    (void)::close(fd);
    discard(operation, "write", path, tmp, err);
  }
  // No retry on EINTR: on Linux the descriptor is released even then.
  if (::close(fd) != 0 && errno != EINTR) discard(operation, "write", path, tmp, errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) discard(operation, "replace", path, tmp, errno);
  sync_directory(path);
}

int probe_file_writable(const std::string& path) noexcept {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return EISDIR;  // rename would fail
  const std::string tmp = impl::atomic_temporary_path(path);
  const int fd = open_temporary(tmp);
  if (fd < 0) return errno;
  (void)::close(fd);
  (void)::unlink(tmp.c_str());
  return 0;
}

void check_file_writable(const std::string& path, const char* operation) {
  const int err = probe_file_writable(path);
  if (err != 0) fail(operation, "write", path, err);
}

}  // namespace kdist
