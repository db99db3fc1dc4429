// Atomic file replacement: every file kdist writes (calibration, traces, K-FAC state, checkpoints,
// logs) goes through write_file_atomically, so a reader sees either the old file or the whole new
// one, never a truncated or empty file.
//
// Contract. The contents go to `<path>.tmp.<pid>` in the same directory, written with POSIX
// write() (partial writes and EINTR retried), fsync'ed, closed (its result checked: NFS and full
// disks report there), then renamed onto `path`; the directory is fsync'ed, best effort. On any
// failure the temporary is removed, `path` is left as it was, and kdist::Error is thrown naming
// `operation`, the path and strerror(errno). A full disk therefore never replaces a good file.
//
// probe_file_writable creates and removes that same temporary, so a caller can check a
// destination before spending time on what it will write (kdist_calibrate does, before
// measuring). Neither function takes a lock: two writers of one path in one process race, and the
// last rename wins.
#pragma once

#include <string>

namespace kdist {

/// Replaces `path` with `contents` atomically; throws kdist::Error naming `operation` and the path.
void write_file_atomically(const std::string& path, const std::string& contents,
                           const char* operation = "kdist::write_file_atomically");

/// 0 if the temporary for `path` can be created (it is removed again), else the errno of the failure.
int probe_file_writable(const std::string& path) noexcept;

/// Throws kdist::Error (naming `operation`, the path and the reason) unless probe_file_writable is 0.
void check_file_writable(const std::string& path, const char* operation = "kdist::check_file_writable");

namespace impl {
/// The temporary write_file_atomically uses for `path`: "<path>.tmp.<pid>" (tests check it is gone).
std::string atomic_temporary_path(const std::string& path);
}  // namespace impl

}  // namespace kdist
