#include "block_manager.hpp"

#include <algorithm>
#include <cstring>

namespace deepinfer {

namespace {
inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}
}  // namespace

uint64_t BlockManager::hash_block(uint64_t parent, const int32_t* tokens, int32_t n) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ULL);
  for (int32_t i = 0; i < n; ++i) h = mix64(h ^ (uint64_t(uint32_t(tokens[i])) + 0x632be59bd9b4e019ULL));
  return h;
}

BlockManager::BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      ref_(num_blocks, 0),
      hashed_(num_blocks, 0),
      hash_(num_blocks, 0),
      parent_hash_(num_blocks, 0),
      lru_prev_(num_blocks, -1),
      lru_next_(num_blocks, -1) {
  if (num_blocks < 1) fail_value("num_blocks must be >= 1, got ", num_blocks);
  if (block_size < 1) fail_value("block_size must be >= 1, got ", block_size);
  if (prefix_caching_) block_tokens_.assign(size_t(num_blocks) * block_size, 0);
  plain_free_.reserve(num_blocks);
  if (prefix_caching_) cached_.reserve(size_t(num_blocks));
  for (int32_t b = num_blocks - 1; b >= 0; --b) plain_free_.push_back(b);  // pop order 0, 1, ...
}

int32_t BlockManager::ref_count(int32_t block) const {
  if (block < 0 || block >= num_blocks_) fail_value("block id ", block, " out of range [0, ", num_blocks_, ")");
  return ref_[block];
}

void BlockManager::lru_push_back(int32_t b) {
  lru_prev_[b] = lru_tail_;
  lru_next_[b] = -1;
  if (lru_tail_ >= 0) lru_next_[lru_tail_] = b; else lru_head_ = b;
  lru_tail_ = b;
  ++num_evictable_;
}

void BlockManager::lru_remove(int32_t b) {
  int32_t p = lru_prev_[b], n = lru_next_[b];
  if (p >= 0) lru_next_[p] = n; else lru_head_ = n;
  if (n >= 0) lru_prev_[n] = p; else lru_tail_ = p;
  lru_prev_[b] = lru_next_[b] = -1;
  --num_evictable_;
}

int32_t BlockManager::take_fresh_block() {
  int32_t b;
  if (!plain_free_.empty()) {
    b = plain_free_.back();
    plain_free_.pop_back();
  } else {
    DI_LEDGER_CHECK(lru_head_ >= 0, "BlockManager: no free block to allocate (free=", num_free_blocks(),
                    "); callers must check can_allocate/can_append first");
    b = lru_head_;  // evict the least recently freed cached block
    lru_remove(b);
    cached_.erase(hash_[b]);
    hashed_[b] = 0;
  }
  DI_LEDGER_CHECK(ref_[b] == 0, "BlockManager: free block ", b, " has ref_count ", ref_[b]);
  ref_[b] = 1;
  return b;
}

bool BlockManager::block_matches(int32_t b, uint64_t parent, const int32_t* tokens) const {
  return parent_hash_[b] == parent &&
         std::memcmp(&block_tokens_[size_t(b) * block_size_], tokens, sizeof(int32_t) * block_size_) == 0;
}

PrefixHit BlockManager::match_prefix(const int32_t* tokens, int32_t max_blocks) const {
  PrefixHit hit;
  if (!prefix_caching_) return hit;
  uint64_t parent = 0;
  for (int32_t i = 0; i < max_blocks; ++i) {
    const int32_t* blk = tokens + size_t(i) * block_size_;
    uint64_t h = hash_block(parent, blk, block_size_);
    auto it = cached_.find(h);
    if (it == cached_.end() || !block_matches(it->second, parent, blk)) break;
    hit.blocks.push_back(it->second);
    if (ref_[it->second] == 0) ++hit.num_evictable;
    hit.last_hash = h;
    parent = h;
  }
  return hit;
}

bool BlockManager::can_allocate(const PrefixHit& hit, int64_t num_tokens) const {
  int64_t fresh = std::max<int64_t>(0, blocks_for(num_tokens) - int64_t(hit.blocks.size()));
  return hit.num_evictable + fresh <= num_free_blocks();
}

void BlockManager::allocate(std::vector<int32_t>& table, const PrefixHit& hit, int64_t num_tokens) {
  DI_LEDGER_CHECK(table.empty(), "BlockManager.allocate: block table already holds ", table.size(), " blocks");
  DI_LEDGER_CHECK(can_allocate(hit, num_tokens), "BlockManager.allocate: not enough free blocks for ",
                  num_tokens, " tokens (free=", num_free_blocks(), ")");
  // Take the hit blocks first: a fresh allocation could otherwise evict one of them.
  for (int32_t b : hit.blocks) {
    if (ref_[b] == 0) lru_remove(b);
    ++ref_[b];
    table.push_back(b);
  }
  int32_t need = blocks_for(num_tokens);
  while (int32_t(table.size()) < need) table.push_back(take_fresh_block());
}

bool BlockManager::can_append(const std::vector<int32_t>& table, int64_t num_tokens) const {
  return std::max<int64_t>(0, blocks_for(num_tokens) - int64_t(table.size())) <= num_free_blocks();
}

void BlockManager::append(std::vector<int32_t>& table, int64_t num_tokens) {
  DI_LEDGER_CHECK(can_append(table, num_tokens), "BlockManager.append: not enough free blocks for ",
                  num_tokens, " tokens (free=", num_free_blocks(), ")");
  int32_t need = blocks_for(num_tokens);
  while (int32_t(table.size()) < need) table.push_back(take_fresh_block());
}

void BlockManager::free(std::vector<int32_t>& table) {
  for (auto it = table.rbegin(); it != table.rend(); ++it) {
    int32_t b = *it;
    DI_LEDGER_CHECK(b >= 0 && b < num_blocks_ && ref_[b] > 0, "BlockManager.free: block ", b,
                    " is not in use (double free)");
    if (--ref_[b] == 0) {
      if (hashed_[b]) lru_push_back(b); else plain_free_.push_back(b);
    }
  }
  table.clear();
}

void BlockManager::cache_full_blocks(const std::vector<int32_t>& table, const int32_t* tokens,
                                     int32_t num_committed_tokens, int32_t& num_hashed, uint64_t& last_hash,
                                     std::vector<uint64_t>* chain) {
  if (!prefix_caching_) return;
  int32_t num_full = std::min<int32_t>(num_committed_tokens / block_size_, int32_t(table.size()));
  for (int32_t i = num_hashed; i < num_full; ++i) {
    const int32_t* blk = tokens + size_t(i) * block_size_;
    uint64_t parent = i == 0 ? 0 : last_hash;
    uint64_t h = hash_block(parent, blk, block_size_);
    int32_t b = table[i];
    if (!hashed_[b] && cached_.find(h) == cached_.end()) {
      // First copy of this content: make it shareable. A duplicate stays unhashed (plain free later).
      hashed_[b] = 1;
      hash_[b] = h;
      parent_hash_[b] = parent;
      std::memcpy(&block_tokens_[size_t(b) * block_size_], blk, sizeof(int32_t) * block_size_);
      cached_.emplace(h, b);
    }
    last_hash = h;
    num_hashed = i + 1;
    if (chain) chain->push_back(h);
  }
}

uint64_t BlockManager::block_hash(int32_t block) const {
  DI_LEDGER_CHECK(block >= 0 && block < num_blocks_ && hashed_[block], "BlockManager.block_hash: block ",
                  block, " is not cached");
  return hash_[block];
}

}  // namespace deepinfer
