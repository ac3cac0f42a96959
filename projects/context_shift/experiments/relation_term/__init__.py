# Copyright (c) mmcalidet contributors. All rights reserved.
