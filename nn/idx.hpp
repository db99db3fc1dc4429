// IDX files (the MNIST format) and the Fashion-MNIST data set, for the example training job.
//
// Contract. read_idx reads one IDX file, gzip-compressed or not (zlib reads both): the magic
// 0x00 0x00 <type> <ndims>, then ndims big-endian uint32 dimensions, then the elements in
// row-major order. Only type 0x08 (unsigned byte, all Fashion-MNIST uses) is accepted. The file
// must hold exactly the bytes its dimensions promise and, when compressed, a gzip stream that
// ends cleanly with a correct CRC. Any failure throws IdxError naming the file and the byte
// offset in the decompressed stream where the problem was found: a truncated header or data
// section, a wrong magic, an unsupported type, trailing bytes, a corrupt or cut gzip stream.
//
// load_fashion_mnist reads the four files of the data set from a directory (the Debian package
// dataset-fashion-mnist installs them to kFashionMnistDefaultDir): images become floats
// x = (pixel / 255 - kFashionMnistMean) / kFashionMnistStd, N x 784 row-major, labels ints in
// [0, 10). A missing directory or file throws DatasetNotFound, whose message gives the apt
// command and the --data DIR override of the example programs.
#pragma once

#include <kdist/core/error.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace kdist::nn {

/// An IDX file's contents: dims as stored (e.g. {60000, 28, 28}) and the bytes, row-major.
struct IdxArray {
  std::vector<std::uint32_t> dims;
  std::vector<std::uint8_t> data;
};

/// A malformed or unreadable IDX file: the message names the file and the byte offset.
class IdxError : public Error {
 public:
  IdxError(const std::string& path, std::uint64_t offset, const std::string& reason);
  const std::string& path() const noexcept { return path_; }
  /// Offset in the decompressed stream where the problem was found.
  std::uint64_t offset() const noexcept { return offset_; }

 private:
  std::string path_;
  std::uint64_t offset_;
};

/// The data set's directory or one of its files is missing; the message says how to install it.
class DatasetNotFound : public Error {
 public:
  using Error::Error;
};

/// Reads an IDX file of unsigned bytes (type 0x08), gzip-compressed or plain.
IdxArray read_idx(const std::string& path);

/// Per-pixel mean and standard deviation of the Fashion-MNIST training images scaled to [0, 1]
/// (over all 47,040,000 training pixels: 0.28604 and 0.35302); applied to train and test alike.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;
inline constexpr int kFashionMnistClasses = 10;
inline constexpr const char* kFashionMnistDefaultDir = "/usr/share/datasets/fashion-mnist";

/// One split: sample i is images[i * features() .. (i + 1) * features()) with label labels[i].
struct Dataset {
  int count = 0;
  int rows = 0;
  int cols = 0;
  std::vector<float> images;
  std::vector<int> labels;
  int features() const { return rows * cols; }
};

struct FashionMnist {
  Dataset train;  // 60000 samples
  Dataset test;   // 10000 samples
};

/// Reads {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from `dir` (the .gz name first).
/// Throws DatasetNotFound for a missing directory or file, IdxError for a malformed one, and
/// kdist::Error when images and labels disagree (count, shape, a label outside [0, 10)).
FashionMnist load_fashion_mnist(const std::string& dir = kFashionMnistDefaultDir);

}  // namespace kdist::nn
