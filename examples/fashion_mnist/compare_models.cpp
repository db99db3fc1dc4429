// compare_models A B [tolerance]: the largest difference between two --save-model files,
// relative to the largest magnitude in A. Exit 0 when it is <= tolerance (default 0: identical).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <vector>

static std::vector<float> read(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> v;
  float x;
  while (in.read(reinterpret_cast<char*>(&x), sizeof x)) v.push_back(x);
  return v;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: compare_models A B [tolerance]\n");
    return 2;
  }
  const std::vector<float> a = read(argv[1]), b = read(argv[2]);
  const double tol = argc > 3 ? std::atof(argv[3]) : 0.0;
  if (a.empty() || a.size() != b.size()) {
    std::printf("sizes differ or empty: %zu and %zu values\n", a.size(), b.size());
    return 1;
  }
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(a[i])));
  }
  const double rel = scale > 0 ? diff / scale : diff;
  std::printf("%zu values, max difference %.3g relative to max |a| %.3g (tolerance %.3g)\n", a.size(), rel, scale, tol);
  return rel <= tol ? 0 : 1;
}
