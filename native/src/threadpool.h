// threadpool.h — a persistent pool: the calling thread and n - 1 workers share
// each parallel region. Workers spin briefly between regions (a decode step runs
// hundreds of regions) and then sleep, so an idle engine costs no CPU.
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

    // Runs fn(task) for every task in [0, n_tasks) across the pool; returns when all are done.
    void run(int n_tasks, const std::function<void(int)> &fn);

private:
    void worker_loop();
    void drain_tasks();

    std::vector<std::thread> workers_;
    const std::function<void(int)> *job_ = nullptr;
    int n_tasks_ = 0;
    std::atomic<int> next_task_{0};
    std::atomic<int> busy_workers_{0};
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> sleepers_{0};
    std::atomic<bool> stop_{false};
    std::mutex mutex_;
    std::condition_variable wake_;
};

} // namespace llmd
