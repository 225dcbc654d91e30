"""How long and how much: FLOPs, α-β collectives, the cost model and its work items, CP and experts, MFU."""
