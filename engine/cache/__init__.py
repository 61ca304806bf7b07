"""The paged KV cache: the page pool on the device, and the host-side bookkeeping of what each page holds."""
