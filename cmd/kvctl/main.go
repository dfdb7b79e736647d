// Command kvctl is the operator's tool for KV-cache offloading to a shared pool.
package main

func main() {}
