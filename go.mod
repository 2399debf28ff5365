module github.com/delaybridge/delaybridge

go 1.26
