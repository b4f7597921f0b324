"""The doctor's pure core, below the runtimes: a node's facts parsed into plain data
(`facts`), the findings and their catalogue (`findings`), what the checks judge against
(`intent`), and the pure judges (`node_checks`, `cluster_checks`, `gpu_checks`, `ports`,
`port_checks`, `neighbours`). Nothing here runs a command; `provisioner.doctor` gathers
the facts and hands them to these judges and to the runtime's own."""
