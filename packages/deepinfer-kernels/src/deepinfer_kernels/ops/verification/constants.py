"""Protocol constants of speculative verification.

``VERIFIED_END`` terminates the accepted-draft prefix of each request in
``verified_token_ids [total_q]``: a request's rows hold its accepted drafts in order, then
``VERIFIED_END`` on every remaining row (its final row included). Readers stop at the first
``VERIFIED_END``: it is a terminator, not a filter (docs/design.md, "Sentinel"). The C++ ledger
reads it as ``deepinfer::kVerifiedEnd``; both ends must change together.
"""

VERIFIED_END = -1
