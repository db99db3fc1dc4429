#include <kdist/core/atomic_file.hpp>
#include <kdist/core/error.hpp>
#include <kdist/core/timeline.hpp>

#include <nlohmann/json.hpp>

namespace kdist {

int Timeline::track(const std::string& name) {
  for (std::size_t i = 0; i < tracks_.size(); ++i)
    if (tracks_[i] == name) return static_cast<int>(i);
  tracks_.push_back(name);
  return static_cast<int>(tracks_.size() - 1);
}

void Timeline::push(int track, const std::string& name, double t0, double t1) {
  if (track < 0 || track >= static_cast<int>(tracks_.size()))
    impl::throw_invalid("kdist::Timeline::record", "unknown track id " + std::to_string(track) + " (have " +
                                                       std::to_string(tracks_.size()) + " tracks)");
  events_.push_back({track, name, t0, t1});
}

std::string Timeline::to_json() const {
  using nlohmann::json;
  json events = json::array();
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", "rank " + std::to_string(rank_)}}}});
  for (std::size_t t = 0; t < tracks_.size(); ++t)
    events.push_back(
        {{"name", "thread_name"}, {"ph", "M"}, {"pid", rank_}, {"tid", t}, {"args", {{"name", tracks_[t]}}}});
  const double offset = clock_ ? clock_->offset() : 0.0;
  for (const Event& e : events_) {
    // Trace events are in microseconds.
    events.push_back({{"name", e.name},
                      {"ph", "X"},
                      {"pid", rank_},
                      {"tid", e.track},
                      {"ts", (e.t0 + offset) * 1e6},
                      {"dur", (e.t1 - e.t0) * 1e6}});
  }
  return json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
}

void Timeline::write(const std::string& path) const {
  write_file_atomically(path, to_json() + '\n', "kdist::Timeline::write");
}

std::string Timeline::merge(const std::vector<std::string>& documents) {
  using nlohmann::json;
  json all = json::array();
  for (const std::string& doc : documents) {
    const json j = json::parse(doc);
    for (const auto& e : j.at("traceEvents")) all.push_back(e);
  }
  return json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace kdist
