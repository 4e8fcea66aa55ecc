"""Instance types and clusters (`topology`), the network figures they carry (`network_figures`)
and a part of one node (`partial`)."""
