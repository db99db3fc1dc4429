// zlib's gzread reads gzip and plain files alike (a file without the gzip magic is passed through),
// so one reader serves both. It reports a gzip stream cut short as Z_BUF_ERROR after returning
// what it could decompress, and a corrupt one (bad block, wrong CRC) as -1: both are turned into
// IdxError with the decompressed offset, as is a plain file that ends before its dimensions say.
#include <kdist/nn/idx.hpp>

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

namespace kdist::nn {

namespace {

constexpr std::uint8_t kTypeUnsignedByte = 0x08;
// Reading in slices keeps a header that lies about its size from allocating before the data is seen.
constexpr std::size_t kSlice = std::size_t(1) << 20;
constexpr std::uint64_t kMaxElements = std::uint64_t(1) << 40;

std::string hex_byte(unsigned v) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02X", v & 0xFFu);
  return buf;
}

const char* type_name(std::uint8_t type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0B:
      return "int16";
    case 0x0C:
      return "int32";
    case 0x0D:
      return "float32";
    case 0x0E:
      return "float64";
    default:
      return nullptr;
  }
}

std::string dims_text(const std::vector<std::uint32_t>& dims) {
  std::string s;
  for (std::size_t i = 0; i < dims.size(); ++i) s += (i ? " x " : "") + std::to_string(dims[i]);
  return s;
}

/// An open gzFile that counts the decompressed bytes delivered, so every error can name its offset.
class GzReader {
 public:
  explicit GzReader(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (!file_) fail(0, std::string("cannot open: ") + std::strerror(errno));
    gzbuffer(file_, 1 << 17);
  }
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  std::uint64_t offset() const { return offset_; }

  [[noreturn]] void fail(std::uint64_t offset, const std::string& reason) const {
    throw IdxError(path_, offset, reason);
  }

  /// Reads up to n bytes; fewer only at the end of the stream. Throws on a corrupt stream.
  std::size_t read(std::uint8_t* buf, std::size_t n) {
    std::size_t total = 0;
    while (total < n) {
      const unsigned ask = static_cast<unsigned>(std::min<std::size_t>(n - total, INT_MAX / 2));
      const int got = gzread(file_, buf + total, ask);
      if (got < 0) fail_stream();
      if (got == 0) break;
      total += static_cast<std::size_t>(got);
      offset_ += static_cast<std::uint64_t>(got);
    }
    return total;
  }

  /// Reads exactly n bytes of the section `what`, or throws naming where the file ended.
  void read_exact(std::uint8_t* buf, std::size_t n, const char* what) {
    const std::uint64_t start = offset_;
    if (read(buf, n) == n) return;
    fail(offset_, std::string("truncated ") + what + ": needs " + std::to_string(n) + " bytes from offset " +
                      std::to_string(start) + ", the file ends at offset " + std::to_string(offset_) + end_reason());
  }

  /// After a short read: why the stream ended ("" for a plain end of file).
  std::string end_reason() const {
    int err = Z_OK;
    const std::string msg = zlib_message(&err);
    return err == Z_BUF_ERROR ? " (gzip stream cut short: " + msg + ")" : std::string();
  }

 private:
  /// zlib's message for the last error, without the "<path>: " it puts in front.
  std::string zlib_message(int* err) const {
    std::string msg = gzerror(file_, err);
    const std::string prefix = path_ + ": ";
    return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
  }

  // zlib discards what it decompressed in the call that failed (and checks the CRC as soon as the
  // stream's last bytes are decompressed, often ahead of the caller), so the error was found somewhere
  // after the bytes delivered so far: the offset named is that of the first byte not delivered.
  [[noreturn]] void fail_stream() const {
    int err = Z_OK;
    const std::string msg = zlib_message(&err);
    if (err == Z_ERRNO) fail(offset_, "read error: " + msg);
    fail(offset_, "corrupt gzip stream (zlib: " + msg + "), found after the " + std::to_string(offset_) +
                      " bytes decompressed cleanly before it");
  }

  std::string path_;
  gzFile file_;
  std::uint64_t offset_ = 0;
};

/// Checks the 4-byte magic; returns the number of dimensions.
int check_magic(const GzReader& in, const std::uint8_t (&magic)[4]) {
  const std::string seen =
      hex_byte(magic[0]) + " " + hex_byte(magic[1]) + " " + hex_byte(magic[2]) + " " + hex_byte(magic[3]);
  const char* name = type_name(magic[2]);
  if (magic[0] != 0 || magic[1] != 0 || !name || magic[3] == 0)
    in.fail(0, "wrong magic " + seen + " (an IDX file starts 0x00 0x00 <type> <ndims>, type 0x08..0x0E, ndims >= 1)");
  if (magic[2] != kTypeUnsignedByte)
    in.fail(2, "unsupported element type " + hex_byte(magic[2]) + " (" + name + "): only 0x08 (unsigned byte) is read");
  return magic[3];
}

std::vector<std::uint32_t> read_dims(GzReader& in, int ndims) {
  std::vector<std::uint8_t> raw(4 * static_cast<std::size_t>(ndims));
  in.read_exact(raw.data(), raw.size(), "header (dimensions)");
  std::vector<std::uint32_t> dims(ndims);
  for (int i = 0; i < ndims; ++i) {
    const std::uint8_t* b = &raw[4 * static_cast<std::size_t>(i)];
    dims[i] = (std::uint32_t(b[0]) << 24) | (std::uint32_t(b[1]) << 16) | (std::uint32_t(b[2]) << 8) | b[3];
  }
  return dims;
}

std::uint64_t element_count(const GzReader& in, const std::vector<std::uint32_t>& dims) {
  std::uint64_t total = 1;
  for (std::uint32_t d : dims) {
    if (d != 0 && total > kMaxElements / d)
      in.fail(4, "dimensions " + dims_text(dims) + " claim more than 2^40 elements: not an IDX data set");
    total *= d;
  }
  return total;
}

void read_data(GzReader& in, std::vector<std::uint8_t>& data, std::uint64_t total, const std::string& dims) {
  const std::uint64_t start = in.offset();
  data.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(total, std::uint64_t(1) << 28)));
  while (data.size() < total) {
    const std::size_t have = data.size();
    const std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(total - have, kSlice));
    data.resize(have + want);
    if (in.read(data.data() + have, want) < want)
      in.fail(in.offset(), "truncated data: dimensions " + dims + " need " + std::to_string(total) +
                               " bytes from offset " + std::to_string(start) + ", the file ends at offset " +
                               std::to_string(in.offset()) + in.end_reason());
  }
}

/// The data must end the file, and a gzip stream must end cleanly: reading to its end makes zlib
/// check the CRC and length trailer, if it has not already.
void check_end(GzReader& in, const std::string& dims) {
  std::uint8_t extra = 0;
  if (in.read(&extra, 1) != 0) in.fail(in.offset() - 1, "trailing bytes after the data (dimensions " + dims + ")");
  const std::string reason = in.end_reason();
  if (!reason.empty()) in.fail(in.offset(), "the gzip stream ends early after the data" + reason);
}

}  // namespace

IdxError::IdxError(const std::string& path, std::uint64_t offset, const std::string& reason)
    : Error("kdist::nn::read_idx: '" + path + "': " + reason + " (byte offset " + std::to_string(offset) +
            " of the decompressed stream)"),
      path_(path),
      offset_(offset) {}

IdxArray read_idx(const std::string& path) {
  GzReader in(path);
  std::uint8_t magic[4];
  in.read_exact(magic, 4, "header (magic)");
  IdxArray out;
  out.dims = read_dims(in, check_magic(in, magic));
  const std::string dims = dims_text(out.dims);
  read_data(in, out.data, element_count(in, out.dims), dims);
  check_end(in, dims);
  return out;
}

// ---- Fashion-MNIST ------------------------------------------------------------------------------

namespace {

constexpr const char* kLoader = "kdist::nn::load_fashion_mnist";

[[noreturn]] void not_found(const std::string& what) {
  throw DatasetNotFound(std::string(kLoader) + ": " + what +
                        ". Install the data set with `sudo apt-get install dataset-fashion-mnist` (it goes to " +
                        kFashionMnistDefaultDir +
                        ", the default directory), or override the directory with --data DIR; it must hold "
                        "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
                        "t10k-labels-idx1-ubyte.gz (uncompressed files without .gz are read too)");
}

bool has_type(const std::string& path, mode_t type) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == type;
}

/// `dir/stem.gz`, else `dir/stem`.
std::string find_file(const std::string& dir, const std::string& stem) {
  const std::string base = dir + "/" + stem;
  if (has_type(base + ".gz", S_IFREG)) return base + ".gz";
  if (has_type(base, S_IFREG)) return base;
  not_found("'" + base + ".gz' is missing");
}

[[noreturn]] void mismatch(const std::string& images, const std::string& labels, const std::string& why) {
  throw Error(std::string(kLoader) + ": '" + images + "' and '" + labels + "' do not fit together: " + why);
}

void check_shapes(const std::vector<std::uint32_t>& images, const std::vector<std::uint32_t>& labels,
                  const std::string& image_path, const std::string& label_path) {
  if (images.size() != 3) mismatch(image_path, label_path, "images are " + dims_text(images) + ", not N x rows x cols");
  if (labels.size() != 1) mismatch(image_path, label_path, "labels are " + dims_text(labels) + ", not N");
  if (images[0] != labels[0])
    mismatch(image_path, label_path,
             std::to_string(images[0]) + " images but " + std::to_string(labels[0]) + " labels");
  if (images[0] > INT_MAX || std::uint64_t(images[1]) * images[2] > INT_MAX)
    mismatch(image_path, label_path, "images " + dims_text(images) + " are too large for int counts");
}

/// The labels, each checked to be a class in [0, kFashionMnistClasses).
std::vector<int> to_labels(const IdxArray& raw, const std::string& path) {
  std::vector<int> labels(raw.data.begin(), raw.data.end());
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= kFashionMnistClasses)
      throw Error(std::string(kLoader) + ": '" + path + "': label " + std::to_string(labels[i]) + " of sample " +
                  std::to_string(i) + " is not a class in [0, " + std::to_string(kFashionMnistClasses) + ")");
  return labels;
}

/// Pixels scaled to [0, 1], then normalised; a table, since a pixel has only 256 values.
std::vector<float> to_images(const IdxArray& raw) {
  float table[256];
  for (int p = 0; p < 256; ++p) table[p] = (static_cast<float>(p) / 255.0f - kFashionMnistMean) / kFashionMnistStd;
  std::vector<float> images(raw.data.size());
  std::transform(raw.data.begin(), raw.data.end(), images.begin(), [&](std::uint8_t p) { return table[p]; });
  return images;
}

Dataset load_split(const std::string& dir, const std::string& prefix) {
  const std::string image_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string label_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  const IdxArray images = read_idx(image_path), labels = read_idx(label_path);
  check_shapes(images.dims, labels.dims, image_path, label_path);
  Dataset out;
  out.count = static_cast<int>(images.dims[0]);
  out.rows = static_cast<int>(images.dims[1]);
  out.cols = static_cast<int>(images.dims[2]);
  out.images = to_images(images);
  out.labels = to_labels(labels, label_path);
  return out;
}

}  // namespace

FashionMnist load_fashion_mnist(const std::string& dir) {
  if (!has_type(dir, S_IFDIR)) not_found("no directory '" + dir + "'");
  return FashionMnist{load_split(dir, "train"), load_split(dir, "t10k")};
}

}  // namespace kdist::nn
