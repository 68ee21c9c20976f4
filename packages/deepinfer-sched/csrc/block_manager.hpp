// BlockManager: paged KV blocks with reference counts and hash-chained prefix sharing.
//
// A block is in exactly one of three states:
//   in use        ref > 0                 (held by >= 1 block table)
//   free, cached  ref == 0, has a hash    (in the LRU list: reusable by a prefix hit or evicted)
//   free, plain   ref == 0, no hash       (in the plain free stack)
// num_free_blocks() counts both free states. Only full blocks whose KV is committed are hashed:
// hash_i = H(hash_{i-1}, tokens of block i), so a hit on block i implies the whole prefix
// matches (tokens and parent hash are compared too: no silent collision). Fresh allocations
// take plain blocks first, then evict the least recently freed cached block.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "common.hpp"

namespace deepinfer {

struct PrefixHit {
  std::vector<int32_t> blocks;  // cached blocks matching the leading full blocks, in order
  uint64_t last_hash = 0;       // chain hash of the last hit block
  int32_t num_evictable = 0;    // hits that are currently free (ref == 0): taking them uses free blocks
  int32_t num_tokens(int32_t block_size) const { return int32_t(blocks.size()) * block_size; }
};

class BlockManager {
 public:
  BlockManager(int32_t num_blocks, int32_t block_size, bool enable_prefix_caching);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  bool prefix_caching() const { return prefix_caching_; }
  int32_t num_free_blocks() const { return int32_t(plain_free_.size()) + num_evictable_; }
  int32_t num_cached_blocks() const { return int32_t(cached_.size()); }
  int32_t ref_count(int32_t block) const;
  int32_t blocks_for(int64_t num_tokens) const { return int32_t((num_tokens + block_size_ - 1) / block_size_); }

  // Admission (check/act): a fresh table for `num_tokens` tokens starting with the hit blocks.
  PrefixHit match_prefix(const int32_t* tokens, int32_t max_blocks) const;
  bool can_allocate(const PrefixHit& hit, int64_t num_tokens) const;
  void allocate(std::vector<int32_t>& table, const PrefixHit& hit, int64_t num_tokens);

  // Growth (check/act): extend `table` to cover `num_tokens` positions.
  bool can_append(const std::vector<int32_t>& table, int64_t num_tokens) const;
  void append(std::vector<int32_t>& table, int64_t num_tokens);

  // Drops one reference per block (last block first, so tails are evicted first); clears table.
  void free(std::vector<int32_t>& table);

  // Registers every full block of `table` below `num_committed_tokens` that is not yet hashed.
  // `tokens` must hold at least num_committed_tokens ids. Advances num_hashed / last_hash.
  // `chain` (if given) gets the chain hash of each newly hashed block appended.
  void cache_full_blocks(const std::vector<int32_t>& table, const int32_t* tokens,
                         int32_t num_committed_tokens, int32_t& num_hashed, uint64_t& last_hash,
                         std::vector<uint64_t>* chain = nullptr);
  // Chain hash of a cached (hashed) block.
  uint64_t block_hash(int32_t block) const;

  static uint64_t hash_block(uint64_t parent, const int32_t* tokens, int32_t n);

 private:
  int32_t take_fresh_block();
  void lru_push_back(int32_t b);
  void lru_remove(int32_t b);
  bool block_matches(int32_t b, uint64_t parent, const int32_t* tokens) const;

  int32_t num_blocks_;
  int32_t block_size_;
  bool prefix_caching_;
  std::vector<int32_t> ref_;
  std::vector<uint8_t> hashed_;
  std::vector<uint64_t> hash_;
  std::vector<uint64_t> parent_hash_;
  std::vector<int32_t> block_tokens_;  // [num_blocks * block_size] tokens of hashed blocks
  std::vector<int32_t> plain_free_;
  std::vector<int32_t> lru_prev_, lru_next_;
  int32_t lru_head_ = -1, lru_tail_ = -1;
  int32_t num_evictable_ = 0;
  std::unordered_map<uint64_t, int32_t> cached_;
};

}  // namespace deepinfer
