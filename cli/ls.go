package cli

import (
	"flag"
	"fmt"
	"strconv"

	"github.com/delaybridge/delaybridge/admin"
)

// cliList is `delaybridge ls`: pending timeouts in due order.
func cliList(c *adminClient, fs *flag.FlagSet, args []string) int {
	ff := addFilterFlags(fs, "only timeouts")
	limit := limitFlag(fs, "rows per page")
	all := fs.Bool("all", false, "follow the cursor and list every matching timeout")
	cursor := fs.String("cursor", "", "start after this cursor (the \"next\" of a previous page)")
	saga := fs.String("saga-id", "", "only timeouts of this saga (NServiceBus saga id, MassTransit schedule token)")
	id := fs.String("id", "", "only the sends of this message id (more than one may be pending: a retry that reuses the id)")
	setUsage(fs, "ls "+filterSynopsis+" [--saga-id S] [--id ID] [--limit N] [--all] [--json]",
		"Lists pending timeouts in due order. A later send of an id that is pending twice shows its\n"+
			"number after the id: \"ID (send 2)\".")
	if code := c.flagsOnly(fs, args); code >= 0 {
		return code
	}
	q, _, code := ff.query(c, fs)
	if code >= 0 {
		return code
	}
	if code := c.checkLimit(fs, *limit); code >= 0 {
		return code
	}
	q.Set("limit", strconv.Itoa(*limit))
	if *saga != "" {
		q.Set("saga_id", *saga)
	}
	if *id != "" {
		q.Set("id", *id)
	}
	var rows []admin.TimeoutJSON
	next, code := pages(c, "/api/v1/timeouts", q, *cursor, *all, func(page *admin.ListJSON) string {
		rows = append(rows, page.Timeouts...)
		return page.Next
	}, func() any { return admin.ListJSON{Timeouts: rows} })
	if code >= 0 {
		return code
	}
	tw := c.table()
	fmt.Fprintln(tw, "ID\tDESTINATION\tDUE\tATTEMPTS\tSTATE\tLAST ERROR")
	for _, r := range rows {
		state := "pending"
		if r.Leased {
			state = "dispatching"
		} else if r.Paused {
			state = "paused"
		} else if r.NotBefore != nil {
			state = "retry after " + fmtTime(*r.NotBefore)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", sendName(&r), r.Dest(), fmtTime(r.DueAt), r.Attempts, state, oneLine(r.LastError, 60))
	}
	tw.Flush()
	c.more(next)
	return exitOK
}
