// threadpool.h — a persistent pool: the calling thread and n - 1 workers share
// each parallel region. Workers spin briefly between regions (a decode step runs
// hundreds of regions) and then sleep, so an idle engine costs no CPU.
//
// Tasks are claimed with a compare-and-swap on one word holding (region,
// task count, next task), so a worker that wakes late can never run a task of a
// region that has moved on, and the caller waits only for tasks actually
// claimed: a descheduled worker never stalls a region it did not join.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace llmd {

class ThreadPool {
public:
    explicit ThreadPool(int n_threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool &) = delete;
    ThreadPool &operator=(const ThreadPool &) = delete;

    int size() const { return static_cast<int>(workers_.size()) + 1; }

    static constexpr int kMaxTasks = 0xffff;

    // Runs fn(task) for every task in [0, n_tasks) across the pool; returns when
    // all are done. More than kMaxTasks tasks run in several rounds.
    void run(int n_tasks, const std::function<void(int)> &fn);

private:
    void worker_loop();
    void work(uint64_t region);

    std::vector<std::thread> workers_;
    const std::function<void(int)> *job_ = nullptr;
    std::atomic<uint64_t> state_{0}; // region << 32 | n_tasks << 16 | next task
    std::atomic<int> done_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
};

} // namespace llmd
