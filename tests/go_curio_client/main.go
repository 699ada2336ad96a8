// A cuzk client as Curio's lib/cuzk/client.go is one, in grpc-go: one connection to `dns:///<address>`,
// plaintext, 256 MiB each way, no keepalive, no retry policy, no WaitForReady, and a deadline on each Prove.
// Debian's grpc-go (1.33) has no grpc.NewClient or credentials/insecure, so it dials with grpc.Dial and
// grpc.WithInsecure(); the calls on the wire are the same (docs: ../shared/domain.md §7).
//
//	curio-client -address 127.0.0.1:9820 [-workers 3] [-calls 10 | -calls 0 -stop-file F] [-size 1024]
//	             [-prefix call] [-kind 1] [-timeout 60s]
//
// Each of -workers runs its calls one after another, as a harmonytask worker does: -calls each, or (-calls 0)
// until -stop-file exists. Each call prints one JSON line on stdout as it ends:
//
//	{"id": "<prefix>-<worker>-<n>", "worker": w, "code": "OK", "message": "", "status": 1,
//	 "proof_len": 1920, "proof_sha256": "…", "elapsed_ms": 12}
//
// `code` is the gRPC status Curio's call got, `status` the AwaitProofResponse status inside an OK (1
// completed). The request is built by the protobuf library from vastctl/route/proving.proto (package cuzkpb,
// generated with protoc at build time).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	pb "cuzkpb"
)

type result struct {
	ID          string `json:"id"`
	Worker      int    `json:"worker"`
	Code        string `json:"code"`
	Message     string `json:"message"`
	Status      int32  `json:"status"`
	ProofLen    int    `json:"proof_len"`
	ProofSHA256 string `json:"proof_sha256"`
	ElapsedMS   int64  `json:"elapsed_ms"`
}

func main() {
	address := flag.String("address", "", "host:port of cuzk (here: vastctl route), as [Cuzk] Address")
	workers := flag.Int("workers", 1, "calls made at once, each worker one after another")
	calls := flag.Int("calls", 1, "calls per worker; 0: until -stop-file exists")
	stopFile := flag.String("stop-file", "", "with -calls 0: a worker starts no new call once this file exists")
	size := flag.Int("size", 1024, "bytes of the vanilla proof in each request")
	prefix := flag.String("prefix", "call", "request ids are <prefix>-<worker>-<n>")
	kind := flag.Int("kind", 1, "proof_kind: 1 PoRep C2, 2 SnapDeals, 3 WindowPoSt, 4 WinningPoSt")
	timeout := flag.Duration("timeout", 60*time.Second, "each Prove's deadline ([Cuzk] ProveTimeout)")
	flag.Parse()
	if *address == "" || (*calls == 0 && *stopFile == "") {
		fmt.Fprintln(os.Stderr, "error: give -address, and -stop-file with -calls 0")
		os.Exit(2)
	}

	conn, err := grpc.Dial("dns:///"+*address, grpc.WithInsecure(),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20)))
	if err != nil {
		fmt.Fprintln(os.Stderr, "error: dial:", err)
		os.Exit(1)
	}
	defer conn.Close()
	client := pb.NewProvingEngineClient(conn)
	payload := make([]byte, *size)
	for i := range payload {
		payload[i] = 7
	}

	var out sync.Mutex
	encoder := json.NewEncoder(os.Stdout)
	print := func(r result) {
		out.Lock()
		defer out.Unlock()
		if err := encoder.Encode(r); err != nil {
			fmt.Fprintln(os.Stderr, "error: stdout:", err)
			os.Exit(1)
		}
	}
	stopped := func() bool {
		if *calls != 0 {
			return false
		}
		_, err := os.Stat(*stopFile)
		return err == nil
	}

	var wg sync.WaitGroup
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for n := 0; (*calls == 0 || n < *calls) && !stopped(); n++ {
				id := fmt.Sprintf("%s-%d-%d", *prefix, w, n)
				request := &pb.ProveRequest{Submit: &pb.SubmitProofRequest{
					RequestId: id, ProofKind: int32(*kind), SectorSize: 32 << 30, RegisteredProof: 8, Priority: 2,
					SectorNumber: uint64(n), MinerId: 1000, VanillaProof: payload}}
				ctx, cancel := context.WithTimeout(context.Background(), *timeout)
				started := time.Now()
				answer, err := client.Prove(ctx, request)
				cancel()
				r := result{ID: id, Worker: w, ElapsedMS: time.Since(started).Milliseconds()}
				if err != nil {
					s := status.Convert(err)
					r.Code, r.Message = s.Code().String(), s.Message()
				} else {
					r.Code = "OK"
					proof := answer.GetResult().GetProof()
					sum := sha256.Sum256(proof)
					r.Status, r.ProofLen, r.ProofSHA256 = answer.GetResult().GetStatus(), len(proof), hex.EncodeToString(sum[:])
					r.Message = answer.GetResult().GetErrorMessage()
				}
				print(r)
			}
		}(w)
	}
	wg.Wait()
}
