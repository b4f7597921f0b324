"""What every way of running Ray agrees on about a node, below the verbs and the runtimes:
where a cluster's things live on a node (`layout`), the `ray start` command lines
(`commands`), and the credentials installed there (`token`, `tls`)."""
